# doctest and Google Benchmark: the installed package when there is one (Debian's doctest-dev and
# libbenchmark-dev, or the CUDA image's), otherwise fetched from their release tags.
include(FetchContent)

if(ATTN_BUILD_TESTS)
  find_package(doctest 2.4 QUIET CONFIG)
  if(doctest_FOUND)
    message(STATUS "doctest: installed package ${doctest_DIR}")
  else()
    message(STATUS "doctest: not installed, fetching v2.4.11")
    FetchContent_Declare(doctest
      URL https://github.com/doctest/doctest/archive/refs/tags/v2.4.11.tar.gz
      DOWNLOAD_EXTRACT_TIMESTAMP ON)
    FetchContent_MakeAvailable(doctest)
  endif()
endif()

if(ATTN_BUILD_BENCH)
  find_package(benchmark 1.6 QUIET CONFIG)
  if(benchmark_FOUND)
    message(STATUS "Google Benchmark: installed package ${benchmark_DIR}")
  else()
    message(STATUS "Google Benchmark: not installed, fetching v1.8.3")
    set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "" FORCE)
    set(BENCHMARK_ENABLE_GTEST_TESTS OFF CACHE BOOL "" FORCE)
    set(BENCHMARK_ENABLE_INSTALL OFF CACHE BOOL "" FORCE)
    FetchContent_Declare(benchmark
      URL https://github.com/google/benchmark/archive/refs/tags/v1.8.3.tar.gz
      DOWNLOAD_EXTRACT_TIMESTAMP ON)
    FetchContent_MakeAvailable(benchmark)
  endif()
endif()
