"""runner.harness.procs.profile.declared_kernels: the names the no-kernel check looks for in the profiler's trace."""

from runner.harness.procs.profile import declared_kernels


def test_kernel_names_with_launch_bounds_on_either_side_of_void():
    src = """
__global__ void plain(float* x) {}
__global__ __launch_bounds__(256) void before_void(const float* __restrict__ x) {}
__global__ void __launch_bounds__(512, 2) after_void(FbArgs a) {}
template <int V> __global__ static void __launch_bounds__(128) templated(FbArgs a, long long n) {}
__device__ float helper(float v) { return v; }
void host_side(float* x) {}
"""
    assert declared_kernels({"k.cu": src}) == ["after_void", "before_void", "plain", "templated"]

