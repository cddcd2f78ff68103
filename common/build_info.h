/// @file build_info.h
/// @brief The commit a build was made from, recorded with the results it measures.
#pragma once

namespace attn {

/// The commit checked out when this program was built, e.g. "8176aa6", with "-dirty" appended
/// when tracked files differed from it, or "unknown" outside a git checkout. Written at every
/// build, so a rebuild after a new commit records the new one.
const char* build_commit();

/// The commit results are recorded under: the ATTN_COMMIT environment variable when it is set
/// and not empty, else build_commit().
const char* results_commit();

}  // namespace attn
