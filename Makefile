# Thin convenience over CMake. The two commands of the README:
#   make demo   installs what is missing, builds, runs the main job
#   make test   installs what is missing, builds, runs every test
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# ccache hits across clones (CI builds a fresh clone in another folder).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps configure build test demo bench fuzz asan clean

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

# libFuzzer targets under ASan+UBSan, built with clang in build-fuzz/.
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCKPT_SANITIZE=address -DCKPT_BUILD_FUZZERS=ON -DCKPT_BUILD_TESTS=OFF \
	  -DCKPT_BUILD_BENCHMARKS=OFF -DCKPT_BUILD_WORKER=OFF
	cmake --build build-fuzz -j $(JOBS)

# The torch-free libraries' tests under ASan+UBSan.
asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=address \
	  -DCKPT_BUILD_WORKER=OFF -DCKPT_BUILD_BENCHMARKS=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS) -L 'format|store|ipc|fuzz'

clean:
	rm -rf $(BUILD) build-fuzz build-asan
