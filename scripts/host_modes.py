"""Does this machine run the same step at two speeds from one process to the next?

Each of N fresh processes times, in alternating blocks, bert's FP32 training step (the cpu
profile's shapes) and four small references that need no gpubench code: a 3-layer MLP's
training step, a ``TransformerEncoderLayer``'s, a streaming add over 2 x 32 MB and a 384 x 384
matmul. One line per process with each one's median milliseconds:

    python scripts/host_modes.py --processes 10 [--threads 2]

On the project's 2-core VMs, at two threads, bert's step and the small references' (MLP,
encoder layer) move together between two levels while the streaming add moves the other way;
at one thread they do not move (docs/history.md, "On real runs").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def one_process(threads: int) -> dict:
    import torch

    from gpubench.measure.memory import steady_malloc
    from gpubench.workloads.builtin import bert

    torch.set_num_threads(threads)
    steady_malloc()
    w = bert("cpu")
    torch.manual_seed(0)
    model = w.build_model()
    x, y = w.make_batch(w.micro_batch, torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def bert_step():
        out = model(x)
        w.loss_fn(getattr(out, "logits", out), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    mlp = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                              torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
    mopt = torch.optim.SGD(mlp.parameters(), lr=1e-3)
    xm, ym = torch.randn(32, 256), torch.randint(0, 10, (32,))

    def mlp_step():
        torch.nn.functional.cross_entropy(mlp(xm), ym).backward()
        mopt.step()
        mopt.zero_grad(set_to_none=True)

    layer = torch.nn.TransformerEncoderLayer(128, 2, 512, dropout=0.0, batch_first=True)
    lopt = torch.optim.SGD(layer.parameters(), lr=1e-3)
    xl = torch.randn(8, 64, 128)

    def layer_step():
        layer(xl).square().mean().backward()
        lopt.step()
        lopt.zero_grad(set_to_none=True)

    a, b = torch.randn(8 << 20), torch.randn(8 << 20)

    def stream_step():
        for _ in range(4):
            torch.add(a, b, out=a)

    ma, mb = torch.randn(384, 384), torch.randn(384, 384)

    def matmul_step():
        for _ in range(20):
            torch.mm(ma, mb)

    steps = {"bert": bert_step, "mlp": mlp_step, "encoder_layer": layer_step,
             "stream_add": stream_step, "matmul": matmul_step}
    for step in steps.values():
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(8):
        for name, step in steps.items():
            step()  # each block's first step absorbs the switch
            for _ in range(5):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    return {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=10, help="fresh processes (10)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each (2)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.processes < 1 or args.threads < 1:
        parser.error(f"--processes and --threads must be at least 1; got {args.processes}, "
                     f"{args.threads}")
    if args.child:
        print(json.dumps(one_process(args.threads)))
        return 0
    print(f"median ms per step, {args.threads} thread(s), one line per fresh process")
    for i in range(args.processes):
        out = subprocess.run([sys.executable, __file__, "--child", "--threads", str(args.threads)],
                             capture_output=True, text=True, env=os.environ, check=True)
        print(i + 1, out.stdout.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
