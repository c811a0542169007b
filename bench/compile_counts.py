"""What a user pays in XLA compilations, before and after warm-up, on the real wheel (XLA:CPU) and the emulator.

    python bench/compile_counts.py                         # every workload, both backends, both settings
    python bench/compile_counts.py --workloads generate_b1 --backends xla_cpu --json

Workloads (tiny models, fixed seeds):
- ``generate_b1`` / ``generate_b4``: 30 greedy requests, prompt lengths 5-300 and 1-64 new tokens, batch 1 / 4
  (a batch's rows have their own lengths, left-padded as a tokenizer does);
- ``train``: 50 Trainer steps (batch 4) on a text dataset of lengths 8-200;
- ``sd3`` / ``flux``: the pipeline, transformer compiled with ``backend="tpu"``, at 2 resolutions x 2 step counts.

Settings: ``hf_tpu`` (its defaults: bucketed generate and Trainer batches, persistent compile caches; warm-up
with ``hf_tpu.warm_up_generate`` / ``warm_up_pipeline`` / one Trainer step per bucket on a copy of the model) and
``upstream`` (``HF_TPU_GENERATE_BUCKETS=0 HF_TPU_TRAIN_BUCKETS=0 HF_TPU_COMPILE_CACHE=0``; the warm-up is the
workload's first request, step or image, as a user meets it). Each cell runs in two fresh processes, the second
with the first one's caches. Counts are TorchTPU's (``torch.tpu._get_cache_stats()``; seconds from hf-tpu's PJRT
shim). The emulator's counts come from its model of TorchTPU's cache: its compiled graphs and its eager executables.

``--json`` prints one record per workload, backend and setting: ``workload``, ``backend``, ``setting``,
``warmup_compilations``, ``after_warmup_compilations``, ``second_process_compilations``, ``compile_seconds``,
``wall_seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("generate_b1", "generate_b4", "train", "sd3", "flux")
BACKENDS = ("xla_cpu", "emulator")
SETTINGS = ("hf_tpu", "upstream")
UPSTREAM = {"HF_TPU_GENERATE_BUCKETS": "0", "HF_TPU_TRAIN_BUCKETS": "0", "HF_TPU_COMPILE_CACHE": "0"}
WORKER_TIMEOUT = 3600.0
REQUESTS, MAX_PROMPT, MAX_NEW = 30, 300, 64
STEPS, TRAIN_BATCH = 50, 4
RESOLUTIONS, STEP_COUNTS = ((32, 32), (64, 64)), (2, 4)


# ---- the worker: one workload in one process ------------------------------------------------------------
def _tiny_qwen3():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         pad_token_id=0, eos_token_id=None)  # fmt: skip
    return Qwen3ForCausalLM(config)


def _requests(batch: int) -> list[tuple[list[int], int]]:
    rng = random.Random(batch)
    return [([rng.randint(5, MAX_PROMPT) for _ in range(batch)], rng.randint(1, MAX_NEW)) for _ in range(REQUESTS)]


def _generate(batch: int, setting: str):
    import torch

    import hf_tpu

    model = _tiny_qwen3().eval().to("tpu")
    model.generation_config.pad_token_id = 0

    def request(lengths: list[int], new: int) -> None:
        width = max(lengths)
        ids = torch.randint(1, 258, (len(lengths), width))
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths):
            ids[row, : width - n] = 0
            mask[row, width - n :] = 1
        out = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=new, do_sample=False)
        out.cpu()  # as a user reads the tokens

    requests = _requests(batch)
    if setting == "hf_tpu":
        warm = lambda: hf_tpu.warm_up_generate(  # noqa: E731
            model,
            max_prompt_length=MAX_PROMPT,
            max_new_tokens=MAX_NEW,
            batch_sizes=(batch,),
            do_sample=False,
            progress=False,
        )
        return warm, [lambda r=r: request(*r) for r in requests]
    return (lambda: request(*requests[0])), [lambda r=r: request(*r) for r in requests[1:]]


def _train(setting: str):
    import copy

    import torch
    from transformers import Trainer, TrainingArguments

    rng = random.Random(0)
    texts = [[rng.randint(1, 257) for _ in range(rng.randint(8, 200))] for _ in range(STEPS * TRAIN_BATCH)]

    def collate(rows: list[dict]) -> dict:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    def trainer(model, data: list[dict], steps: int) -> Trainer:
        args = TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="hf-tpu-bench-"), per_device_train_batch_size=TRAIN_BATCH,
            max_steps=steps, report_to=[], save_strategy="no", logging_strategy="no", learning_rate=1e-3,
            dataloader_num_workers=0, disable_tqdm=True,
            dataloader_pin_memory=False,  # XLA:CPU's plugin has no pinned host memory; no effect on compilations
        )  # fmt: skip
        return Trainer(model=model, args=args, train_dataset=data, data_collator=collate)

    model = _tiny_qwen3()
    data = [{"input_ids": t} for t in texts]
    if setting == "hf_tpu":
        from hf_tpu.transformers.train_shapes import bucket

        lengths = sorted({bucket(n) for n in range(8, 201)})

        # one step per bucket, each its own batch (Trainer shuffles a dataset's rows across batches), padded as real
        # batches are (rows one token short): a batch without padding has an all-ones mask, for which transformers
        # builds no attention mask at all - other ops, other executables
        def warm() -> None:
            for n in lengths:
                batch = [{"input_ids": [1] * (n - (row > 0))} for row in range(TRAIN_BATCH)]
                trainer(copy.deepcopy(model), batch, 1).train()

        return warm, [lambda: trainer(model, data, STEPS).train()]
    # upstream: the warm-up a user meets is a first step (one batch); then the same 50-step run
    return (lambda: trainer(copy.deepcopy(model), data[:TRAIN_BATCH], 1).train()), [
        lambda: trainer(model, data, STEPS).train()
    ]


def _pipeline(name: str, setting: str):
    import torch

    import hf_tpu

    sys.path.insert(0, str(ROOT))
    from tests.diffusers.pipelines import build_flux, build_sd3, load

    path = Path(tempfile.mkdtemp(prefix=f"hf-tpu-bench-{name}-"))
    (build_sd3 if name == "sd3" else build_flux)(path)
    pipe = load(name, path).to("tpu")
    pipe.set_progress_bar_config(disable=True)
    pipe.transformer.compile(backend="tpu", fullgraph=True, dynamic=False)
    combos = [(h, w, s) for h, w in RESOLUTIONS for s in STEP_COUNTS]

    def image(h: int, w: int, s: int) -> None:
        pipe("a photo of a cat", height=h, width=w, num_inference_steps=s, output_type="np",
             generator=torch.Generator("tpu").manual_seed(0))  # fmt: skip

    runs = [lambda c=c: image(*c) for c in combos]
    if setting == "hf_tpu":
        warm = lambda: hf_tpu.warm_up_pipeline(  # noqa: E731
            pipe,
            resolutions=RESOLUTIONS,
            num_inference_steps=STEP_COUNTS,
            prompt="a photo of a cat",
            output_type="np",
            generator=torch.Generator("tpu").manual_seed(0),  # as the requests do: warm up with what they pass
            progress=False,
        )
        return warm, runs
    return runs[0], runs[1:]


def worker(workload: str, setting: str) -> dict:
    import torch

    from hf_tpu.compilations import count_compilations

    if workload.startswith("generate"):
        warm, runs = _generate(int(workload[-1]), setting)
    elif workload == "train":
        warm, runs = _train(setting)
    else:
        warm, runs = _pipeline(workload, setting)
    with count_compilations() as warmup:
        warm()
    with count_compilations() as after:
        for run in runs:
            run()
    torch.accelerator.synchronize()
    return {"warmup": [warmup.compilations, warmup.seconds], "after": [after.compilations, after.seconds]}


# ---- the driver: cells in fresh processes ---------------------------------------------------------------
def _python(backend: str, given: str | None) -> str:
    if backend == "emulator":
        return sys.executable
    if given:
        return given
    sys.path.insert(0, str(ROOT))
    from tests.environments import ensure

    return str(ensure("xla-cpu") / "bin" / "python")


def _cell(python: str, backend: str, workload: str, setting: str, cache: Path) -> dict:
    env = dict(os.environ, HF_TPU_CACHE=str(cache), PYTHONPATH=str(ROOT / "bench"))
    env.pop("HF_TPU_EMULATE" if backend == "xla_cpu" else "HF_TPU_XLA_CPU", None)
    env["HF_TPU_EMULATE" if backend == "emulator" else "HF_TPU_XLA_CPU"] = "1"
    if setting == "upstream":
        env.update(UPSTREAM)
    cmd = [python, str(Path(__file__).resolve()), "--worker", workload, "--setting", setting]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{backend}/{workload}/{setting} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def _fresh_cache(backend: str) -> Path:
    """A cache directory with the built parts (emulator core, PJRT shim) shared and no compiled programs."""
    from hf_tpu.plumbing.cache import cache_root

    cache = Path(tempfile.mkdtemp(prefix="hf-tpu-bench-cache-"))
    for part in ("emulator", "xla_cpu"):
        if (cache_root() / part).exists():
            (cache / part).symlink_to(cache_root() / part)
    # TorchTPU's tier-2 cache (on with tier 3) lives in host memory, shared by every run on this host
    shutil.rmtree("/dev/shm/torch_tpu_cache/default", ignore_errors=True)
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--xla-cpu-python", help="the interpreter of an environment with hf-tpu[xla-cpu]")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.setting)))
        return
    records = []
    if not args.json:
        print(f"{'workload':<12} {'backend':<9} {'setting':<9} {'warm-up':>9} {'after':>7} {'2nd proc':>9} "
              f"{'compile s':>10} {'wall s':>7}")  # fmt: skip
    for backend in args.backends.split(","):
        python = _python(backend, args.xla_cpu_python)
        for workload in args.workloads.split(","):
            for setting in args.settings.split(","):
                cache = _fresh_cache(backend)
                start = time.perf_counter()
                try:
                    first = _cell(python, backend, workload, setting, cache)
                    second = _cell(python, backend, workload, setting, cache)
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
                record = {
                    "workload": workload,
                    "backend": backend,
                    "setting": setting,
                    "warmup_compilations": first["warmup"][0],
                    "after_warmup_compilations": first["after"][0],
                    "second_process_compilations": second["warmup"][0] + second["after"][0],
                    "compile_seconds": round(first["warmup"][1] + first["after"][1], 2),
                    "wall_seconds": round(time.perf_counter() - start, 1),  # both processes
                }
                records.append(record)
                if args.json:
                    print(json.dumps(record), flush=True)
                else:
                    print(f"{workload:<12} {backend:<9} {setting:<9} {record['warmup_compilations']:>9} "
                          f"{record['after_warmup_compilations']:>7} {record['second_process_compilations']:>9} "
                          f"{record['compile_seconds']:>10.1f} {record['wall_seconds']:>7.0f}", flush=True)  # fmt: skip
    if not args.json:
        _side_by_side(records)


# How close the emulator's count is held to the real wheel's: a zero exactly (what warm-up and the persistent caches
# promise), any other count within this ratio range. Measured (docs/performance.md's table): the emulator counts fewer for
# generate and diffusion (0.65-0.83: TorchTPU also compiles some chains of eager ops into executables of their own,
# which its model of the cache keys does not reproduce), training within 3 % but for upstream's first step (1.21).
# The one disagreement left: SD3's second process on the real wheel compiles 2 programs again (not explained).
RATIO_RANGE = (0.6, 1.25)


def agrees(emulator: int, real: int) -> bool:
    """Whether an emulator count agrees with the real wheel's within the stated tolerance."""
    if real == 0 or emulator == 0:
        return emulator == real
    return RATIO_RANGE[0] <= emulator / real <= RATIO_RANGE[1]


def _side_by_side(records: list[dict]) -> None:
    """The emulator's counts beside the real wheel's, for each cell both backends ran."""
    cells = {(r["workload"], r["setting"], r["backend"]): r for r in records}
    pairs = [(w, s) for (w, s, b) in cells if b == "xla_cpu" and (w, s, "emulator") in cells]
    if not pairs:
        return
    low, high = RATIO_RANGE
    print(f"\nemulator / real wheel (XLA compilations; agree: a zero exactly, else a ratio within {low}-{high}):")
    keys = ("warmup_compilations", "after_warmup_compilations", "second_process_compilations")
    for workload, setting in pairs:
        real, emu = cells[(workload, setting, "xla_cpu")], cells[(workload, setting, "emulator")]
        row = [f"{key.split('_')[0]} {emu[key]}/{real[key]}" for key in keys]
        verdict = "agree" if all(agrees(emu[key], real[key]) for key in keys) else "DISAGREE"
        print(f"  {workload:<12} {setting:<9} " + ", ".join(row) + f"  {verdict}")


if __name__ == "__main__":
    main()
