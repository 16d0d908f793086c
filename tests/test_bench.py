"""`make bench` reports model FLOP/s against the chip's published peak, when the chip is known."""

from diloco_lite import bench


def test_known_chips_are_found_by_device_kind():
    assert bench.chip_peaks("NVIDIA A100-SXM4-40GB") == (312e12, 19.5e12)
    assert bench.chip_peaks("TPU v5 lite") == (197e12, None)  # not v5p's 459
    assert bench.chip_peaks("TPU v5") == (459e12, None)
    assert bench.chip_peaks("Tesla T4")[0] == 65e12
    assert bench.chip_peaks("cpu") is None


def test_the_report_line_scales_the_peak_by_the_devices_in_use():
    line = bench.chip_line("TPU v2", 8, 18e12)  # 8 cores of 22.5 TFLOP/s
    assert "10.00% of the bf16 peak (180.0 TFLOP/s)" in line and "f32" not in line
    line = bench.chip_line("NVIDIA L4", 1, 3.03e12)
    assert "10.00% of the f32 peak" in line
    assert "measured matmul peak" in bench.chip_line("cpu", 8, 1e9)
