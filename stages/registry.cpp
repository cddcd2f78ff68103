// The registry: the one list of stages. Adding a stage is one line in ATTN_STAGES below
// (its directory stages/NN_name/ is found by stages/CMakeLists.txt).
#include "registry.h"

#define ATTN_STAGES(X) \
  X(01_naive) \
  X(02_kv_split) \
  X(03_persistent) \
  X(04_wmma) \
  X(05_cp_async) \
  X(06_warp_specialized) \
  X(07_overlap)

namespace attn {

#define ATTN_DECLARE_STAGE(name) StageInfo stage_##name();
ATTN_STAGES(ATTN_DECLARE_STAGE)
#undef ATTN_DECLARE_STAGE

const std::vector<StageInfo>& registered_stages() {
#define ATTN_LIST_STAGE(name) stage_##name(),
  static const std::vector<StageInfo> stages = {ATTN_STAGES(ATTN_LIST_STAGE)};
#undef ATTN_LIST_STAGE
  return stages;
}

Status find_stage(const std::string& name, const StageInfo** out) {
  std::string names;
  for (const StageInfo& s : registered_stages()) {
    if (name == s.name) {
      *out = &s;
      return Status::Ok();
    }
    names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  return Status::Error("stage '" + name + "' is not registered; registered stages: " + names);
}

Status stage_at(int index, const StageInfo** out) {
  const int n = static_cast<int>(registered_stages().size());
  if (index < 0 || index >= n) {
    return Status::Error("stage index (" + std::to_string(index) + ") is out of range: " + std::to_string(n) +
                         " stages are registered (0.." + std::to_string(n - 1) + ")");
  }
  *out = &registered_stages()[static_cast<size_t>(index)];
  return Status::Ok();
}

}  // namespace attn
