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


def test_end_to_end_runs_are_the_issue_s_configs():
    runs = bench.end_to_end_configs(300)
    assert list(runs) == ["DDP", "DiLoCo H=50", "Decoupled H=50"]
    for config in runs.values():
        assert (config.workers, config.batch_size, config.seq_len, config.steps) == (8, 16, 64, 300)
        assert config.eval_every is None  # the default schedule
    assert runs["DiLoCo H=50"].algorithm.inner_steps == 50
    assert runs["Decoupled H=50"].algorithm.fragments == 4


def test_steady_tokens_per_s_leaves_out_the_first_rows_and_the_last():
    import pandas as pd

    # compilation in the first row (10 s) and in the last (the flush, 5 s); 1 s per 10 steps
    history = pd.DataFrame({"step": [10, 20, 30, 40, 50],
                            "wall_time_s": [10.0, 11.0, 12.0, 13.0, 19.0]})
    assert bench.steady_tokens_per_s(history, tokens_per_step=100, from_step=15) == 1000.0
    assert bench.steady_tokens_per_s(history, tokens_per_step=100, from_step=2) == 1000.0


def test_a_layout_s_process_sets_its_own_device_count_and_flags():
    env = bench.child_env(2, {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false --my_flag=1 "
                                           "--xla_cpu_collective_call_warn_stuck_timeout_seconds"
                                           "=120", "DILOCO_LITE_DEVICES": "8", "HOME": "/h"})
    assert env == {"XLA_FLAGS": "--my_flag=1", "DILOCO_LITE_DEVICES": "2", "HOME": "/h"}
    only_ours = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
    assert "XLA_FLAGS" not in bench.child_env(8, only_ours)


def test_the_end_to_end_table_has_a_row_per_run_and_a_column_per_layout():
    table = bench.end_to_end_table({8: {"DDP": (100_000.0, 40.0), "DiLoCo H=50": (150_000.0, 30.0)},
                                    2: {"DDP": (90_000.0, 35.0), "DiLoCo H=50": (140_000.0, 25.0)}})
    lines = table.splitlines()
    assert "8 devices" in lines[1] and "2 devices (4 workers each)" in lines[1]
    assert "100,000 (40 s)" in lines[2] and "90,000 (35 s)" in lines[2]
    assert lines[3].startswith("DiLoCo H=50") and "140,000 (25 s)" in lines[3]


def test_the_profile_counts_every_matmul_of_a_training_step():
    """The profile's FLOPs per class, by hand for the tiny model: 2·m·k·n per matmul, three per
    use (the forward and the backward's two); model_flops_per_token's 6·N counts the same
    weights plus those that no matmul multiplies (positions, layer norms, biases), and its
    attention term is the two attention matmuls of every layer."""
    from diloco_lite import profile
    from diloco_lite.model import build_model, count_params, model_flops_per_token

    from .helpers import TINY, replace

    cfg = replace(TINY, vocab_size=65, n_layers=2)
    b, n = 3, 16  # sequences, seq_len
    t, d, f, h, k, v, layers = b * n, cfg.d_model, 2 * cfg.d_model, 2, cfg.d_model // 2, 65, 2
    per_layer = {"qkv": 3 * 2 * t * d * 3 * d, "attention scores": 3 * 2 * b * h * n * n * k,
                 "attention·values": 3 * 2 * b * h * n * n * k, "proj": 3 * 2 * t * d * d,
                 "mlp up": 3 * 2 * t * d * f, "mlp down": 3 * 2 * t * f * d}
    by_hand = {**{name: layers * x for name, x in per_layer.items()},
               "output head": 3 * 2 * t * d * v}
    classes = profile.matmul_classes(cfg, b, n)
    assert {name: c[4] for name, c in classes.items()} == by_hand

    weights = layers * (d * 3 * d + d * d + 2 * d * f) + v * d  # what the matmuls multiply
    others = cfg.context * d + 2 * d * (2 * layers + 1) + layers * (2 * d + f)
    assert count_params(build_model(cfg).init(0)) == weights + others
    model_flops = model_flops_per_token(cfg, n, weights + others) * t
    assert model_flops - sum(by_hand.values()) == 6 * t * others

    # XLA's own count of each class's functions, as the profile times them
    for name, (spec, a, b_shape, uses, flops) in classes.items():
        fns = profile._matmul_fns(spec, a, b_shape, uses)
        assert sum(profile.xla_flops(fn, *args) for fn, args in fns.values()) == flops, name


def test_the_profile_table_has_a_row_per_matmul_class_and_the_totals():
    from diloco_lite import profile

    rows = {name: {"flops": 2e6, "fwd": 1e-3, "dA": 1e-3, "dB": 2e-3}
            for name in ("qkv", "mlp up")}
    p = {"sequences": 16, "seq_len": 64, "devices": 2, "peak": 1e9, "classes": rows,
         "matmul_flops": 4e6, "matmul_s": 8e-3, "model_flops": 5e6, "xla_grad_flops": None,
         "dispatch_s": 1e-5, "grad_s": 9e-3, "step_s": 1e-2, "ceiling": 1.25, "mfu": 1.0,
         "rest_share": 0.2, "at_peak_bound": 1.0}
    lines = profile.profile_table(p).splitlines()
    # 2 devices x 2 MFLOP in 4 ms: 1 GFLOP/s, 100% of the peak, 40% of the step
    assert lines[2].split()[1:] == ["2.0", "1.000", "1.000", "2.000", "1.0", "100.0%", "40.0%"]
    assert lines[4].startswith("  all matmuls") and "80.0%" in lines[4]
    assert "20.0% of the step" in lines[5] and "unavailable" in lines[-1]
