/// @file registry.h
/// @brief The registry of stages: one list (in stages/registry.cpp) that drives the runner,
///        the tests, the benchmarks and the chart.
#pragma once

#include <string>
#include <vector>

#include "stage.h"
#include "status.h"

namespace attn {

/// Every stage, in order (01 first).
const std::vector<StageInfo>& registered_stages();

/// The stage named @p name, e.g. "01_naive"; the error lists the registered names.
Status find_stage(const std::string& name, const StageInfo** out);

/// The stage at position @p index of registered_stages(); the error gives the valid range.
Status stage_at(int index, const StageInfo** out);

}  // namespace attn
