"""A GPU replica's models= (make deploy GPU=1): handlers/plan.py's GPU plan over the tuned entries.

The tuned values were measured on CPUs: a CPU plan on a GPU host would leave each model one worker
with one thread for its JPEG decoding and a CPU's batch. Each model whose archive may run on a GPU
(no `deviceType: cpu` in its model-config.yaml) gets one worker per GPU, the cores left by the
CPU-only models shared among those workers, and a device's batch; its delay and timeout are kept.
A CPU-only model (an ONNX or int8 variant) keeps its tuned values. A model whose default archive
pins the CPU (an AOTInductor package compiled for this CPU) is served on a GPU replica from its
sibling that may take a GPU (`<name>.torchscript.mar`, serving/gpu_archive.py), where one is built.
"""

from __future__ import annotations

import dataclasses

from deployment.inputs import Inputs
from handlers.plan import gpu_plan
from serving.gpu_archive import gpu_sibling, runs_on_cpu
from serving.ts_config import ModelEntry


def on_gpu(inputs: Inputs) -> Inputs:
    """The inputs of a GPU replica: a model served from its default archive that pins the CPU moves to
    its first sibling (`<name>.<variant>.mar`, by name) that may take a GPU. A marName config.properties
    chose, and a model without such a sibling, stay as they are."""
    if not inputs.gpus:
        return inputs
    entries, archives = [], dict(inputs.archives)
    for entry in inputs.entries:
        archive = inputs.archives[entry.name]
        if entry.archive == f"{entry.name}.mar" and runs_on_cpu(archive):
            sibling = gpu_sibling(archive, entry.name)
            if sibling is not None:
                entry = dataclasses.replace(entry, mar_name=sibling.name)
                archives[entry.name] = sibling
        entries.append(entry)
    return dataclasses.replace(inputs, entries=tuple(entries), archives=archives)


def entries(inputs: Inputs) -> tuple[ModelEntry, ...]:
    """models= for a replica with `inputs.gpus` GPUs (the tuned entries where there are none)."""
    if not inputs.gpus:
        return inputs.entries
    on_cpu = {e.name for e in inputs.entries if runs_on_cpu(inputs.archives[e.name])}
    cpu_cores = sum(e.settings.max_workers * (e.settings.threads or 1) for e in inputs.entries if e.name in on_cpu)
    on_gpu = [e for e in inputs.entries if e.name not in on_cpu]
    if not on_gpu:
        return inputs.entries
    cores = max(1, inputs.mix.cores - cpu_cores)
    out = []
    for entry in inputs.entries:
        if entry.name in on_cpu:
            out.append(entry)
            continue
        plan = gpu_plan(inputs.gpus, cores, len(on_gpu), entry.settings.batch_size)
        settings = dataclasses.replace(entry.settings, min_workers=plan.workers, max_workers=plan.workers,
                                       threads=plan.threads, batch_size=plan.batch_size)
        out.append(dataclasses.replace(entry, settings=settings))
    return tuple(out)
