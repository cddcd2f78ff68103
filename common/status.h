/// @file status.h
/// @brief Errors as values: every entry point returns a Status instead of aborting.
#pragma once

#include <string>
#include <utility>

namespace attn {

/// The result of an operation: ok, or an error with a message that names the field and value.
class [[nodiscard]] Status {
 public:
  /// An ok status.
  Status() = default;
  /// An ok status (reads better at a return site than `Status()`).
  static Status Ok() { return Status(); }
  /// An error carrying @p message.
  static Status Error(std::string message) { return Status(std::move(message), false); }

  /// True when no error occurred.
  bool ok() const { return ok_; }
  /// True when no error occurred.
  explicit operator bool() const { return ok_; }
  /// The error message; empty when ok.
  const std::string& message() const { return message_; }

 private:
  Status(std::string message, bool ok) : message_(std::move(message)), ok_(ok) {}
  std::string message_;
  bool ok_ = true;
};

}  // namespace attn

/// Return the status of @p expr from the enclosing function when it is an error.
#define ATTN_TRY(expr)                           \
  do {                                           \
    ::attn::Status attn_try_status_ = (expr);    \
    if (!attn_try_status_.ok()) return attn_try_status_; \
  } while (0)
