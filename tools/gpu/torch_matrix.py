"""The fused route's matrix that `run.sh torch` writes under OUT/torch
(pytorch_gpu_<model>_<precision>_<mode>.md, one bench/pytorch_gpu_benchmark.py
table each): its rows for summarize.py's table, against the issue's targets
(bnps sync / plain BatchNorm <= 1.25 eager, <= 1.15 captured in a CUDA
graph, at P = 2 and 4, batch 32)."""

import os
import re

EAGER_TARGET = 1.25
CAPTURED_TARGET = 1.15
MODELS = {"resnet18": "ResNet-18", "resnet50": "ResNet-50 shape"}
PRECISIONS = {"fp32": "float32", "bf16": "bf16 autocast, channels_last"}
MODES = ("eager", "captured")
_NAME = re.compile(r"^pytorch_gpu_(resnet18|resnet50)_(fp32|bf16)_"
                   r"(eager|captured)\.md$")


def collect(sub, table_under, num, spread):
    """[{model, precision, mode, procs, batch, plain_ms, stream_ms, stream,
    torch}] from the folder `sub` (summarize.py's table_under, num and
    spread read the tables), in the matrix's order; [] where none ran."""
    found = []
    try:
        names = sorted(os.listdir(sub))
    except OSError:
        return []
    for name in names:
        m = _NAME.match(name)
        if not m:
            continue
        with open(os.path.join(sub, name), encoding="utf-8",
                  errors="replace") as f:
            text = f.read()
        for r in table_under(text, ""):
            try:
                procs, batch = int(r["P"]), int(r["batch"])
            except (KeyError, ValueError):
                continue
            found.append({
                "model": m.group(1), "precision": m.group(2),
                "mode": m.group(3), "procs": procs, "batch": batch,
                "plain_ms": num(r.get("plain ms")),
                "stream_ms": num(r.get("bnps stream ms")),
                "stream": spread(r.get("stream/plain min / median / max")),
                "torch": spread(r.get("torch/plain min / median / max"))})
    order = {(mo, p, md): i for i, (mo, p, md) in enumerate(
        (mo, p, md) for mo in MODELS for p in PRECISIONS for md in MODES)}
    found.sort(key=lambda r: (order[(r["model"], r["precision"], r["mode"])],
                              r["procs"], r["batch"]))
    return found


def text(sub):
    """The matrix's tables for the docs' section: each file's first line as
    a heading sentence (its MPS details dropped), then its step-time
    table."""
    lines = []
    try:
        names = sorted(n for n in os.listdir(sub) if _NAME.match(n))
    except OSError:
        return []
    for name in names:
        with open(os.path.join(sub, name), encoding="utf-8",
                  errors="replace") as f:
            body = f.read().splitlines()
        if not body:
            continue
        table = []
        for line in body[1:]:
            if line.startswith("|"):
                table.append(line)
            elif table:
                break
        lines += ["", body[0].split("; gpu:")[0].rstrip(".") + ":", ""]
        lines += table
    return lines


def rows(matrix, fmt, verdict):
    """summarize.py's (figure, value, target, verdict) rows of the batch-32
    cells; the gloo peer's ratio beside the eager ones."""
    out = []
    for r in matrix:
        if r["batch"] != 32:
            continue
        target = EAGER_TARGET if r["mode"] == "eager" else CAPTURED_TARGET
        lo, med, hi = r["stream"]
        peer = ""
        if r["torch"][1] is not None:
            peer = "; torch SyncBatchNorm (gloo) %s" % fmt(r["torch"][1])
        out.append((
            "bnps.torch sync / plain BN, fused route, %s, %s, %s, %d "
            "processes, batch 32" % (
                MODELS[r["model"]], PRECISIONS[r["precision"]],
                "captured in a CUDA graph" if r["mode"] == "captured"
                else "eager", r["procs"]),
            "%s (%s-%s)%s" % (fmt(med), fmt(lo), fmt(hi), peer),
            "<= %.2f" % target, verdict(med, target)))
    return out
