# doctest and Google Benchmark: the installed package when there is one (Debian's doctest-dev and
# libbenchmark-dev, which tools/setup.sh installs), otherwise downloaded from their release tags.
include(FetchContent)

# Download <url> once into the build tree and make it available as <name>. The download is tried
# once, with a short time limit, so that a machine without a network fails in seconds with a hint
# instead of retrying for minutes and printing FetchContent's log.
function(attn_fetch name url package)
  set(archive ${CMAKE_BINARY_DIR}/_downloads/${name}.tar.gz)
  if(NOT EXISTS ${archive})
    message(STATUS "${name}: not installed, downloading ${url}")
    file(DOWNLOAD ${url} ${archive}.part STATUS result TIMEOUT 60 INACTIVITY_TIMEOUT 15)
    list(GET result 0 code)
    if(NOT code EQUAL 0)
      list(GET result 1 reason)
      file(REMOVE ${archive}.part)
      message(FATAL_ERROR
        "${name} is not installed and its download failed (${reason}). Run tools/setup.sh "
        "(it installs ${package} on Debian/Ubuntu), or install ${name}, then configure again.")
    endif()
    file(RENAME ${archive}.part ${archive})
  endif()
  FetchContent_Declare(${name} URL ${archive} DOWNLOAD_EXTRACT_TIMESTAMP ON)
  FetchContent_MakeAvailable(${name})
endfunction()

if(ATTN_BUILD_TESTS)
  find_package(doctest 2.4 QUIET CONFIG)
  if(doctest_FOUND)
    message(STATUS "doctest: installed package ${doctest_DIR}")
  else()
    attn_fetch(doctest https://github.com/doctest/doctest/archive/refs/tags/v2.4.11.tar.gz doctest-dev)
  endif()
endif()

if(ATTN_BUILD_BENCH)
  find_package(benchmark 1.6 QUIET CONFIG)
  if(benchmark_FOUND)
    message(STATUS "Google Benchmark: installed package ${benchmark_DIR}")
  else()
    set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "" FORCE)
    set(BENCHMARK_ENABLE_GTEST_TESTS OFF CACHE BOOL "" FORCE)
    set(BENCHMARK_ENABLE_INSTALL OFF CACHE BOOL "" FORCE)
    attn_fetch(benchmark https://github.com/google/benchmark/archive/refs/tags/v1.8.3.tar.gz libbenchmark-dev)
  endif()
endif()
