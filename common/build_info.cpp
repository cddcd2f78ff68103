#include "build_info.h"

#include <cstdlib>

namespace attn {

const char* results_commit() {
  const char* env = std::getenv("ATTN_COMMIT");
  return env != nullptr && *env != '\0' ? env : build_commit();
}

}  // namespace attn
