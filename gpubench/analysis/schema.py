"""The record's fields, documented once: what each ``extra_info`` field of a gpubench record
means, its unit, and the type and range ``gpubench.analysis.results`` checks it against.

The techniques' own fields (``RunConfig`` and ``LoaderConfig``) are documented and typed by their
declarations (``gpubench.train.techniques``); ``METRICS`` holds every other field. The reference
page of the documentation (``reference/metrics.md``) is generated from it.
"""

from __future__ import annotations

from dataclasses import dataclass

TYPES = {
    "str": ("str", "any"), "bool": ("bool", "any"), "int": ("int", "any"),
    "int>=0": ("int", ">=0"), "int>=1": ("int", ">=1"),
    "float": ("float", "any"), "float>=0": ("float", ">=0"), "float>0": ("float", ">0"),
    "loss": ("float", "loss"), "ints>=0": ("ints", ">=0"), "floats>0": ("floats", ">0"),
    "floats loss": ("floats", "loss"),
    "map>=0": ("map", ">=0"),
}
"""Type names of ``Metric.type``: (type, constraint) as ``results`` checks them. Types: str, int,
bool, float, ints / floats (lists), map (a mapping of names to numbers); constraints: >0, >=0,
>=1, any (finite), loss (any number, NaN allowed: a diverged loss is a measurement)."""


@dataclass(frozen=True)
class Metric:
    fields: tuple[str, ...]
    type: str | tuple[str | None, ...] | None
    """One name of ``TYPES`` for every field, one per field, or None: not checked (a mapping or
    a list of mappings, or a column the summary derives)."""
    unit: str
    meaning: str
    kind: str = "step"
    """The records that carry it: ``step`` (a benchmark case), ``claim``, ``overhead`` or
    ``transfer`` (benchmarks/test_claims.py, test_overhead.py, test_transfer.py), ``derived``
    (not in the record: a column the results frame, summary and charts compute)."""

    def types(self) -> dict[str, tuple[str, str] | None]:
        kinds = self.type if isinstance(self.type, tuple) else (self.type,) * len(self.fields)
        return {f: TYPES[k] if k else None for f, k in zip(self.fields, kinds, strict=True)}


METRICS: tuple[Metric, ...] = (
    # What was run
    Metric(("schema",), "int>=0", "",
           "the version of the record (``gpubench.measure.version``); records without it are "
           "version 0, read by ``gpubench.analysis.results.upgrade``"),
    Metric(("model", "workload", "profile", "device", "case_id"), "str", "",
           "the workload's short name, the spec it was built from, the profile, the device, and "
           "the case id (the workload's name and the tags of what differs from its FP32 "
           "baseline)"),
    Metric(("kind", "group"), "str", "",
           "the record's kind (step, claim, overhead, transfer) and the case group it answers"),
    Metric(("is_baseline", "timed"), "bool", "",
           "the FP32 single-device case the model's other cases are compared with; false "
           "where the case ran but was not timed (a failed case's record)"),
    Metric(("global_batch", "input_shape", "seed"), ("int>=1", "ints>=0", "int"),
           "samples, elements",
           "samples per optimizer step over every replica (micro-batch x k x replicas); the "
           "micro-batch's input shape; the seed of weights and data"),
    Metric(("workload_datasets",), None, "", "the workload's own datasets, by name"),
    Metric(("hf_attention",), "str", "",
           "the default attention implementation of the workload's Hugging Face transformers "
           "model (``config._attn_implementation``; null for other models), what "
           "``attn_implementation`` default means"),
    Metric(("uses_sdpa",), "bool", "",
           "the workload's forward calls ``scaled_dot_product_attention`` (the attention "
           "group's cases pin its kernel)"),
    Metric(("device_name", "launcher", "cudnn_benchmark"), ("str", "str", "bool"), "",
           "the device's name; the launcher of a ``gpubench dist`` record (``torchrun``, "
           "``slurm``: a task of srun, ``local``: submitit's local executor); "
           "whether cuDNN autotuning was on (CUDA cases)"),
    Metric(("job_id", "nodes", "node_list", "tasks_per_node", "gpus_per_node"),
           ("str", "int>=1", "str", "int>=1", "int>=0"), "",
           "``gpubench dist`` records: the job's id (Slurm's, submitit's local job; null under "
           "a plain torchrun), its node count, its hosts (comma-separated, expanded), the ranks "
           "on each node, and the GPUs Slurm gave each node (null where it says none)"),
    Metric(("nccl_version", "ib_devices", "net_env"), ("str", None, "str"), "",
           "``gpubench dist`` records: the interconnect facts a rank can read: the NCCL version "
           "(CUDA), the InfiniBand devices under /sys/class/infiniband, and the NCCL/Gloo "
           "variables that choose the network, where set"),
    Metric(("note",), "str", "", "what the reader should know about the figures (a FLOP count "
           "that left out ops, an inert technique)"),
    # Time
    Metric(("step_time_s", "step_time_iqr_s"), ("float>0", "float>=0"), "s",
           "median and IQR of the timed rounds; one round is one complete optimizer step (k "
           "micro-batches, including waiting for their batches), ended by a device "
           "synchronize"),
    Metric(("samples_per_s",), "float>0", "samples/s",
           "global batch / median step time"),
    Metric(("rank_step_time_s",), "floats>0", "s",
           "multi-process cases: each rank's own median step time"),
    Metric(("speedup_paired", "speedup_paired_low", "speedup_paired_high", "speedup_paired_p",
            "speedup_paired_test"), ("float>0", "float>0", "float>0", "float>=0", "str"),
           "ratio",
           "throughput relative to the FP32 baseline from paired rounds (blocks of each side "
           "in ABBA order, the first step after each switch of side untimed, the k-th timed "
           "step of a case block paired with the k-th of the baseline block beside it): the "
           "median per-round ratio, its 95% interval, the p-value of the paired test and the "
           "test's name"),
    Metric(("speedup_paired_width", "rounds_stop", "rounds_width", "rounds_target_width",
            "rounds_min", "rounds_max", "rounds_max_time_s", "warmup_steps",
            "paired_block_steps", "paired_order"), None, "",
           "how the timed rounds ended: the paired speedup's 95% interval as a relative "
           "half-width (0.02: +-2%), why the rounds stopped (``width``: the interval reached "
           "``rounds_target_width``; ``time``: the case's time cap, ``rounds_max_time_s`` "
           "seconds of its timed rounds; ``rounds``: ``rounds_max``, or the fixed count when no "
           "target was set), the width the stopping rule saw (unpaired cases: of the median "
           "step time), the least rounds, the warm-up steps run before the step was steady, "
           "and the block layout of the paired rounds (steps per block, ``ABBA``)"),
    Metric(("baseline_step_time_s", "paired_baseline_rounds_s", "paired_baseline_case_id",
            "paired_partner", "paired_baseline_steady_s"),
           ("float>0", "floats>0", "str", "str", "float>0"), "s",
           "the paired baseline's median step time and its rounds, its case id, where it "
           "ran (this process, or a worker process of its own), and, in this process, its "
           "median step at rest just before the rounds, beside the case built and idle (what a "
           "disturbed pairing is read against)"),
    Metric(("paired_worker_offset", "paired_worker_offset_width"), ("float>0", "float>=0"),
           "ratio",
           "a case paired with the baseline's worker process: that process's speed against "
           "the benchmark process's, the same baseline built in each and stepped in paired "
           "blocks when the worker started (median per-round ratio, this process's step over "
           "the worker's), and its 95% interval's relative half-width; None where the "
           "baseline did not fit beside the worker's"),
    Metric(("speedup", "speedup_offset"), None, "ratio",
           "throughput relative to the FP32 baseline: ``speedup_paired``, else case samples/s "
           "/ baseline samples/s. A case paired with the baseline's worker process (``--partner "
           "worker``; in older records also multi-process cases, ``expseg``, ``empty_cache`` "
           "on CUDA) has it scaled by "
           "``speedup_offset``: ``paired_worker_offset``, or in records without it the "
           "baseline case's step time over the worker baseline's",
           kind="derived"),
    Metric(("scaling_efficiency", "single_case_id"), (None, "str"), "ratio",
           "parallel cases: samples/s / (devices x samples/s of ``single_case_id``, the "
           "single-device case with the same per-device settings; read back by configuration, "
           "``gpubench.analysis.results.single_device_case``)"),
    Metric(("attention_kernels", "fp8_gemm_flops_fraction"), (None, "float>=0"), "names, ratio",
           "the fused attention kernels the step ran (flash, efficient, cudnn, flash (cpu); "
           "empty: none, the math path's matmuls), seen by the FLOP counter as their ops; and "
           "the share of the step's GEMM FLOPs (its matrix multiplications, "
           "``gpubench.measure.flops.GEMM_OPS``: linear layers, the math attention path's "
           "products; not convolutions or fused attention) run as float8 matmuls "
           "(``torch._scaled_mm``, torchao's float8 linears), null where it ran none. Records "
           "before version 2 held ``fp8_flops_fraction``, a share of all counted FLOPs, read "
           "as this where it was 0"),
    Metric(("attention_kernels_from",), "str", "",
           "what ``attention_kernels`` (and the FLOP count) traced: ``step``, the step the case "
           "timed; ``eager model``, a compiled case's eager model (``_orig_mod``), whose "
           "kernels are the eager trace's, not necessarily what the compiled code ran (under "
           "torch.compile transformers may pass SDPA a materialised mask, which rules flash "
           "out: docs/gpu.md)"),
    Metric(("first_step_s", "compile_time_s", "break_even_steps", "break_even_against"),
           ("float>=0", "float>=0", "float>=0", "str"), "s, steps",
           "the training check's first step (with torch.compile: its compilation); compile "
           "cases: the seconds the check's first steps took beyond a steady step's until the "
           "step was steady (the compilation, autotuning and reduce-overhead's CUDA-graph "
           "capture, ``compile_steps`` steps), compiled into a fresh Inductor and Triton "
           "cache, and the steps after which compiling has paid off "
           "(compile time / seconds saved per step against ``break_even_against``, the same "
           "configuration uncompiled: the paired baseline where it is that; null in the record "
           "otherwise, and filled where results are read from the twin measured in the same run "
           "(``gpubench.analysis.results.with_compile_break_even``); null where no twin was "
           "measured or the compiled step saves nothing)"),
    Metric(("uncompiled_step_time_s",), None, "s",
           "compiled cases: the step time of ``break_even_against``, the same configuration "
           "uncompiled, that ``break_even_steps`` compares with (null: not measured)",
           kind="derived"),
    Metric(("check_step_times_s",), "floats>0", "s",
           "each training step of the check, the device synchronized after it (the slowest "
           "rank's): what ``compile_time_s`` is read from"),
    Metric(("compile_steps", "compile_cache_hits", "compile_cache_misses"), "int>=0", "count",
           "compile cases: the check's steps counted in ``compile_time_s``; the FX graph and "
           "AOTAutograd cache hits and misses of its compilation (each case compiles into an "
           "empty cache of its own: a hit would mean a graph compiled elsewhere)"),
    Metric(("harness_s",), "map>=0", "s",
           "wall seconds of each part of the case's measurement (build, prepare, check, count, "
           "warmup, partner, rounds, finish, close)"),
    # Memory
    Metric(("peak_memory_bytes", "peak_memory_method"), ("int>=0", "str"), "bytes",
           "CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``; CPU (Linux): the "
           "process's resident high-water mark ``VmHWM``, reset before the timed steps, so it "
           "includes the interpreter and libraries; and how it was measured"),
    Metric(("resident_base_bytes", "peak_above_base_bytes"), "int>=0", "bytes",
           "CPU (Linux): the process's resident size before the case built its model "
           "(interpreter, libraries, what earlier cases left), and the training peak: "
           "``VmHWM`` above it, what a user's loop measures the same way; null on CUDA"),
    Metric(("step_memory_bytes",), "int>=0", "bytes",
           "how far the timed steps raised memory above what was held when they began "
           "(activations, temporaries, gradients freed by ``set_to_none``): the part "
           "techniques change"),
    Metric(("peak_reserved_bytes",), "int>=0", "bytes",
           "CUDA: ``max_memory_reserved`` (the caching allocator's footprint)"),
    Metric(("alloc_retries", "alloc_ooms", "peak_active_bytes", "fragmentation"),
           ("int>=0", "int>=0", "int>=0", "float>=0"), "count, bytes, fraction",
           "CUDA, from ``torch.cuda.memory_stats`` right after the measured steps: "
           "``cudaMalloc`` failures that freed the cache and retried, out-of-memory errors, the "
           "active-block peak, and 1 - allocated peak / reserved peak"),
    Metric(("activation_bytes",), "int>=0", "bytes",
           "bytes autograd saves for backward per micro-batch, counted with "
           "``saved_tensors_hooks`` (parameters excluded; autocast's low-precision weight "
           "copies included)"),
    Metric(("param_bytes", "grad_bytes", "optimizer_state_bytes"), "int>=0", "bytes",
           "exact sizes of the parameters, their gradients and the optimizer state the process "
           "holds (FSDP: the rank's shards)"),
    Metric(("rank_peak_memory_bytes", "rank_step_memory_bytes", "device_peak_memory_bytes"),
           "ints>=0", "bytes",
           "multi-process cases: each rank's peak and step memory (``peak_memory_bytes`` is "
           "then the max over ranks); every device of the case"),
    # FLOPs
    Metric(("model_flops_per_step", "hardware_flops_per_step", "flops_per_step"), "int>=0",
           "FLOPs",
           "FLOPs of one step by ``torch.utils.flop_counter``: model FLOPs by the convention of "
           "published MFU figures (no recomputation, attention in full), hardware FLOPs what "
           "the kernels did (checkpointing's re-run forward, the fused attention backward's "
           "recompute); ``flops_per_step`` is the hardware figure"),
    Metric(("rank_flops_per_step",), "ints>=0", "FLOPs", "each rank's hardware FLOPs"),
    Metric(("uncounted_ops", "count_reused"), (None, "bool"), "",
           "heavy ops that ran without a FLOP formula (``tflops``, ``mfu`` and ``hfu`` are then "
           "null: the count misses work); whether the FLOP and "
           "activation count was taken from the previous case, whose count this case's equals"),
    Metric(("tflops", "hardware_tflops", "peak_tflops"), "float>=0", "TFLOP/s",
           "achieved TFLOP/s of the model and hardware FLOPs; the measured matmul peak of the "
           "device at the step's precision, times the devices the case occupies"),
    Metric(("mfu", "hfu"), "float>=0", "fraction",
           "model and hardware FLOP utilisation: achieved / ``peak_tflops``; null where "
           "``uncounted_ops`` names work the count missed"),
    Metric(("fp8_peak_tflops", "mfu_fp8"), "float>=0", "TFLOP/s, fraction",
           "fp8 cases: the measured float8 matmul peak of the devices (``torch._scaled_mm``) "
           "and the model FLOP utilisation against it (``mfu`` is against bf16's); null "
           "without FP8 units"),
    Metric(("fp8_converted", "fp8_emulated"), (None, "bool"), "",
           "fp8 cases: the linears converted to float8 training (their module names), and "
           "whether the float8 casts and matmuls were emulated (no FP8 units: a CPU, a GPU "
           "below compute capability 8.9), which makes the speed not FP8's"),
    # The training check
    Metric(("loss_first", "last_loss", "loss_reference", "loss_rtol"), "loss", "loss",
           "the first and last loss of the case's check, the FP32 reference's first loss, and "
           "the relative tolerance the check allowed"),
    Metric(("check_losses",), "floats loss", "loss", "the losses of the check's steps"),
    Metric(("check_grad_cosine", "check_grad_norm_ratio", "check_update_cosine",
            "check_update_norm_ratio"), "loss", "ratio",
           "the gradient-level training check against IEEE FP32 (worst rank): cosine "
           "similarity and norm ratio of the gradients and of the optimizer updates"),
    Metric(("check_skipped_steps", "dynamo_recompiles"), "int>=0", "count",
           "optimizer steps GradScaler skipped in the check; torch.compile recompilations"),
    # Data loading
    Metric(("loader_stall_fraction", "loader_wait_s"), "float>=0", "fraction, s",
           "share of the timed step time spent waiting for the next batch (loader plus the "
           "copy call), and that wait per step"),
    Metric(("loader_samples_per_s", "time_to_first_batch_s", "epoch_restart_s"), "float>=0",
           "samples/s, s",
           "the loader alone, no model: samples/s over 10 batches; time from a fresh iterator "
           "to its first batch; the same at the next epoch"),
    Metric(("cold_files", "cold_resident_fraction", "cold_evict_s"),
           ("int>=0", "float>=0", "float>=0"), "count, fraction, s",
           "cold cases: the dataset's files, the share of their pages still cached right "
           "after an eviction, the median seconds of one eviction"),
    Metric(("storage_read_mb_s", "storage_cached_mb_s", "storage_random_iops",
            "storage_resident_after_evict", "storage_fs", "storage_note"),
           ("float>=0", "float>=0", "float>=0", "float>=0", "str", "str"), "MB/s, IO/s",
           "the storage probe of the data folder (per run): sequential cold and cached reads "
           "(10^6 bytes/s), random reads per second, the share left cached after an eviction, "
           "the filesystem, why the probe could not run"),
    # Communication
    Metric(("allreduce_time_s", "comm_time_s", "comm_fraction"), "float>=0", "s, fraction",
           "DDP: one all-reduce of a gradient-sized buffer timed alone; times the all-reduces "
           "per step; as a share of the step time (an estimate: DDP overlaps it)"),
    # The machine during the rounds
    Metric(("telemetry_cpu_util", "telemetry_cpu_freq_mhz", "telemetry_load_avg",
            "telemetry_run_queue", "telemetry_steal_pct", "telemetry_foreign_cpu"), "float>=0",
           "%, MHz, threads, cores",
           "sampled every 0.1 s during the timed rounds: the CPU the case's own processes "
           "used (% of the cores), CPU frequency, 1-minute load average, mean runnable "
           "threads, steal time (% of CPU time), cores other processes used"),
    Metric(("telemetry_gpu_util", "telemetry_sm_clock_mhz", "telemetry_mem_clock_mhz",
            "telemetry_power_w", "telemetry_temp_c"),
           ("float>=0", "float>=0", "float>=0", "float>=0", "float"), "%, MHz, W, C",
           "CUDA cases, through NVML: mean GPU utilisation, SM and memory clocks, power of the "
           "case's GPUs together (NVML's 1 s average on recent GPUs), highest temperature"),
    Metric(("telemetry_throttle_reasons", "telemetry_foreign_processes"), None, "",
           "CUDA: clock-event reasons with their share of samples; other processes on the "
           "case's GPUs"),
    Metric(("energy_j_per_step", "samples_per_kj", "energy_power_w", "telemetry_energy_j"),
           "float>=0", "J, samples/kJ, W, J",
           "the GPUs' energy counters (NVML) over a block of the case's own rounds back to "
           "back after its paired rounds (an unpaired case: its timed rounds): joules per "
           "step, samples per kJ, average power, joules in all"),
    Metric(("energy_source",), "str", "",
           "what the energy figures cover: a block of the case's own rounds, its timed rounds "
           "(the paired baseline's steps read out when there is one), or sampled power"),
    Metric(("energy_covers_j", "energy_covers_s", "energy_covers_steps"),
           ("float>=0", "float>=0", "int>=0"), "J, s, count",
           "the joules, seconds and steps the case's energy figures are computed from"),
    Metric(("baseline_energy_j_per_step", "baseline_samples_per_kj", "baseline_energy_power_w",
            "baseline_energy_covers_j", "baseline_energy_covers_s",
            "baseline_energy_covers_steps"),
           ("float>=0",) * 5 + ("int>=0",), "J, samples/kJ, W, J, s, count",
           "a paired case's FP32 baseline in its own block right after the case's (its "
           "device alone): joules per step, samples per kJ, power, and what they cover"),
    Metric(("telemetry_period_s", "telemetry_samples", "telemetry_window_s",
            "telemetry_sampler_cpu_s", "telemetry_note"),
           ("float>=0", "int>=0", "float>=0", "float>=0", "str"), "s, count",
           "the sampling: period, samples taken, seconds covered, the sampler's own CPU "
           "seconds, and why a figure is missing"),
    Metric(("contended", "contention_reason"), ("bool", "str"), "",
           "whether something else competed with the case during its timed rounds, and what "
           "(CPU steal, other busy processes, too many runnable threads, another process on "
           "its GPU, a GPU slowed for heat or power)"),
    Metric(("top_ops", "top_ops_time", "trace_files"), (None, "str", None), "s, fraction",
           "with ``--trace``: the 10 operators with the most self time per step (name, "
           "self_time_s, calls, share, flops), which clock they were timed on, and the trace "
           "files"),
    # Claims (benchmarks/test_claims.py): two sides timed in alternation
    Metric(("claim", "case_id_base", "case_id_new"), "str", "",
           "the claim and the case ids of its two sides", kind="claim"),
    Metric(("rounds_base_s", "rounds_new_s"), "floats>0", "s",
           "each side's rounds, alternating", kind="claim"),
    Metric(("global_batch_base", "global_batch_new", "accum_steps_new"), "int>=1", "samples",
           "each side's global batch, and the new side's accumulation", kind="claim"),
    Metric(("activation_bytes_base", "activation_bytes_new"), "int>=0", "bytes",
           "each side's saved activations", kind="claim"),
    # Overheads (benchmarks/test_overhead.py)
    Metric(("gpubench_step_time_s", "handwritten_step_time_s", "harness_overhead"),
           ("float>=0", "float>=0", "float"), "s, ratio",
           "gpubench's step against a minimal hand-written loop of the same model, batch, "
           "data and optimizer in alternating rounds; the median per-pair ratio minus one",
           kind="overhead"),
    Metric(("harness_overhead_low", "harness_overhead_high"), "float", "ratio",
           "the 95% bootstrap interval of that median per-pair ratio, minus one: the spread of "
           "this run's pairs (builds and processes add about 1% more)", kind="overhead"),
    Metric(("overhead_pairs", "overhead_builds"), "int>=1", "pairs, builds",
           "the alternating pairs the overhead figure is the median of, and the builds of each "
           "side they take turns on (fewer than asked where the device ran out of memory)",
           kind="overhead"),
    Metric(("telemetry_on_step_time_s", "telemetry_off_step_time_s", "telemetry_overhead",
            "telemetry_overhead_median", "telemetry_sample_cpu_s", "telemetry_cpu_share"),
           ("float>=0", "float>=0", "float", "float", "float>=0", "float>=0"), "s, ratio",
           "steps with the telemetry sampling and paused, alternating: their mean step times, "
           "total time on / off minus one (and the same of the medians), the CPU time of one "
           "sample and its share of the sampling period", kind="overhead"),
    Metric(("telemetry_overhead_low", "telemetry_overhead_high"), "float", "ratio",
           "the 95% bootstrap interval of that total time on / off, minus one, over the pairs "
           "of rounds", kind="overhead"),
    Metric(("rounds_on_s", "rounds_off_s"), "floats>0", "s",
           "the rounds with the telemetry sampling and paused", kind="overhead"),
    Metric(("process_overhead_s",), "float>=0", "s",
           "median time to send a no-op command to 2 worker processes and collect both "
           "replies: what multi-process cases pay per step on top of the step", kind="overhead"),
    # Host-to-device transfers (benchmarks/test_transfer.py)
    Metric(("bytes", "copies_per_round", "matmuls_per_round"), "int>=0", "bytes, count",
           "the copy's size, copies and matmuls per round", kind="transfer"),
    Metric(("bandwidth_gb_s", "copy_time_s", "matmul_time_s", "overlapped_time_s",
            "overlap_fraction"), "float>=0", "GB/s, s, fraction",
           "copy bandwidth (10^9 bytes/s), the copy and the matmuls timed alone and together, "
           "and the share of the copy hidden behind the matmuls", kind="transfer"),
)


def field_types() -> dict[str, tuple[str, str]]:
    """Every typed field of ``METRICS``: (type, constraint)."""
    return {f: t for m in METRICS for f, t in m.types().items() if t is not None}
