# Thin convenience over CMake. The two commands of the README:
#   make demo   installs what is missing, builds, runs the main job
#   make test   installs what is missing, builds, runs every test
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# ccache hits across clones (CI builds a fresh clone in another folder).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps configure build test demo bench fuzz fuzz-run asan tsan clean

all: build

deps:
	@scripts/setup-deps

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

demo: build
	scripts/demo

bench: build
	@for b in store ring train population; do $(BUILD)/bench/ckpt-bench $$b || exit 1; done

# libFuzzer targets under ASan+UBSan, built with clang in build-fuzz/ (each
# decoder of untrusted input: tests/fuzz/*_fuzz.cc). `make fuzz-run` replays
# each one's committed corpus, then fuzzes each for FUZZ_SECONDS, one after
# the other (tests/fuzz/run.sh; crashes land in build-fuzz/fuzz-work/NAME/artifacts).
FUZZERS := checkpoint record tcp_frame control_request experiment_config service_config pickle \
           pt_archive safetensors tool_args tensor_dataset
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= $(JOBS)

fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCKPT_SANITIZE=address -DCKPT_BUILD_FUZZERS=ON -DCKPT_BUILD_TESTS=OFF \
	  -DCKPT_BUILD_BENCHMARKS=OFF -DCKPT_BUILD_WORKER=OFF
	cmake --build build-fuzz -j $(FUZZ_JOBS) --target $(FUZZERS:%=%_fuzz)

fuzz-run: fuzz
	tests/fuzz/run.sh --seconds $(FUZZ_SECONDS) $(FUZZERS)

# Every torch-free test (format, store, ipc, scheduler logic, metrics, the
# unpickler, fuzz corpora) under ASan+UBSan, in build-asan/ (no LibTorch:
# the tests that need ckpt-worker are not built there).
asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=address \
	  -DCKPT_BUILD_WORKER=OFF -DCKPT_BUILD_BENCHMARKS=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS) --timeout 1800

# The torch-free libraries' tests under TSan, in build-tsan/. GCC 12 warns
# that TSan does not model std::atomic_thread_fence (Boost.Asio's fenced
# blocks, in every handler): under -Werror that stopped the scheduler's build,
# so the warning stays a warning here.
tsan: deps
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_SANITIZE=thread \
	  -DCKPT_BUILD_WORKER=OFF -DCKPT_BUILD_BENCHMARKS=OFF -DCKPT_BUILD_TOOLS=OFF \
	  -DCMAKE_CXX_FLAGS=-Wno-error=tsan
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $$TSAN_OPTIONS" \
	  ctest --output-on-failure -j $(JOBS) --timeout 1800 -L 'base|format|store|ipc|records|scheduler|metrics'

clean:
	rm -rf $(BUILD) build-fuzz build-asan build-tsan
