# attn_add_stage(<name> <sources...>): the whole build of one stage.
#   - library  attn_stage_<name>  (the kernel and its launch; links attn_common)
#   - program  <name>             (build/stages/<name>/<name>: runs this stage on one shape)
# The program's main() is generated from common/stage_main.cpp.in, so a stage directory holds
# only its kernel and a one-line CMakeLists.txt.
function(attn_add_stage name)
  set(lib attn_stage_${name})
  add_library(${lib} STATIC ${ARGN})
  target_link_libraries(${lib} PUBLIC attn_common)
  attn_cuda_options(${lib})
  # A ptxas warning in a stage is an error, and so are its "Potential Performance Loss" notes
  # (wgmma products serialised, register moves ignored), which it prints as "info": the launcher
  # fails on them.
  target_compile_options(${lib} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-Werror>)
  set_target_properties(${lib} PROPERTIES
                        CUDA_COMPILER_LAUNCHER ${PROJECT_SOURCE_DIR}/cmake/ptxas_guard.sh)

  set(ATTN_STAGE_NAME ${name})
  configure_file(${PROJECT_SOURCE_DIR}/common/stage_main.cpp.in
                 ${CMAKE_CURRENT_BINARY_DIR}/stage_main.cpp @ONLY)
  add_executable(attn_stage_${name}_main ${CMAKE_CURRENT_BINARY_DIR}/stage_main.cpp)
  set_target_properties(attn_stage_${name}_main PROPERTIES OUTPUT_NAME ${name})
  target_link_libraries(attn_stage_${name}_main PRIVATE ${lib} attn_cli)

  set_property(GLOBAL APPEND PROPERTY ATTN_STAGE_LIBRARIES ${lib})
  set_property(GLOBAL APPEND PROPERTY ATTN_STAGE_PROGRAMS attn_stage_${name}_main)
endfunction()

# Compile options every CUDA target shares.
function(attn_cuda_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr>)
  # Whether this build has sm_90a code: Hopper-only stages refuse to launch without it (their
  # kernels are empty in every other architecture's code).
  if("90a" IN_LIST CMAKE_CUDA_ARCHITECTURES)
    target_compile_definitions(${target} PRIVATE ATTN_HAS_SM90A=1)
  endif()
  if(ATTN_PTXAS_VERBOSE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  endif()
endfunction()
