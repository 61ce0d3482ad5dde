"""bnps.export: the trained model out of a job's shard servers.

    import bnps.export
    bnps.export.export("model.safetensors", servers="127.0.0.1:7000,127.0.0.1:7001")
    state = bnps.export.load("model.safetensors")   # {name: torch.Tensor}
    model.load_state_dict(state, strict=True)

export() reads every shard without joining the job (the read-only ReadState
call, through the C++ client library: client/job_reader.h) and writes its
parameters and BN running statistics as safetensors, exactly as
`bnps_status --export` does (client/state_export.h has the rules): the
built-in CNN's keys become the names of the equivalent torch.nn module
("stem.conv.w" -> "stem.conv.weight", ".gamma"/".beta" -> ".weight"/".bias";
other keys, such as bnps.torch models', are kept), and each BN layer L gets
L.running_mean, L.running_var and L.num_batches_tracked. It works while the
job runs, after it (servers started with --keep_serving, or restarted on
their final checkpoints) and over TLS with the job token.

load() reads a safetensors file into torch tensors: with the safetensors
package if it is installed, else with the small reader here (the format is
an 8-byte little-endian header length, a JSON header, then raw
little-endian data).
"""

import json
import struct

from bnps import errors


def export(path, servers, job="bnps", token_file="", tls_ca="", tls_cert="",
           tls_key="", timeout_s=30.0):
    """Writes the job's state to `path`; returns {"step", "job_complete",
    "parameters", "bn_layers"}. Raises bnps.errors.BnpsError subclasses
    (Unavailable for a server that cannot be reached, ...)."""
    from bnps import _native  # the C library (libbnps.so)
    if isinstance(servers, str):
        servers = [s for s in servers.split(",") if s]
    # _native raises the package's own errors (bnps.errors).
    return _native.export(list(servers), str(path), job, token_file or "",
                          tls_ca or "", tls_cert or "", tls_key or "",
                          float(timeout_s))


_DTYPES = {"F32": ("float32", 4), "F64": ("float64", 8), "I64": ("int64", 8)}


def load(path):
    """{name: torch.Tensor} of the safetensors file `path` (CPU tensors)."""
    try:
        from safetensors.torch import load_file
        return load_file(str(path))
    except ImportError:
        pass
    import torch
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = memoryview(data)[8 + n:]
    out = {}
    for name, t in header.items():
        dtype, _ = _DTYPES[t["dtype"]]
        begin, end = t["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]),
                                dtype=getattr(torch, dtype)) if end > begin \
            else torch.empty(0, dtype=getattr(torch, dtype))
        out[name] = flat.reshape(t["shape"])
    return out


def metadata(path):
    """The file's "__metadata__" (bnps_step, bnps_job_complete, format)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})
