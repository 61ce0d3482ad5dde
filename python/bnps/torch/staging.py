"""Staging: one SyncBatchNorm layer's small copies between its device and
the host (per-channel moments, sums and coefficients: a few KB), made
cheap on a GPU.

A copy to the host goes through a reusable pinned buffer on the current
stream and waits for that stream only (not the whole device); a copy to the
device goes from a reusable pinned buffer, asynchronously. On the CPU both
are plain tensor conversions. Buffers are kept per purpose (`key`) and grown
to the largest size asked; nothing is allocated per call once a layer has
run a step, apart from the small result tensors themselves.

A pinned buffer is not rewritten while a copy from it may still be running:
each device copy records an event, and the next use of the buffer waits for
it (by then it has always completed, since every exchange waits for its
stream before the layer uploads again).

Not thread-safe: one layer's calls come from one thread (autograd's, or the
caller's).
"""

import time

import torch


class Staging:
    def __init__(self):
        self._host = {}    # key -> pinned CPU tensor (1-D)
        self._events = {}  # key -> the CUDA event of the last upload from it
        # Seconds spent waiting for the device in to_host, summed (a
        # diagnostic: bench/pytorch_gpu_benchmark.py reports it).
        self.wait_s = 0.0

    def _buffer(self, key, numel, dtype):
        buf = self._host.get(key)
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            with torch.inference_mode(False):  # reused outside it too
                buf = torch.empty(numel, dtype=dtype, pin_memory=True)
            self._host[key] = buf
            self._events.pop(key, None)
        event = self._events.get(key)
        if event is not None:
            event.synchronize()
        return buf[:numel]

    def to_host(self, key, t):
        """A CPU tensor (of its own, contiguous) with `t`'s values and
        dtype. For a CUDA tensor: one asynchronous copy into a pinned buffer
        on the current stream, then a wait for that stream."""
        if t.device.type != "cuda":
            return t.detach().to("cpu", copy=True).contiguous()
        t = t.detach().contiguous()
        buf = self._buffer(key, t.numel(), t.dtype).view(t.shape)
        buf.copy_(t, non_blocking=True)
        start = time.perf_counter()
        torch.cuda.current_stream(t.device).synchronize()
        self.wait_s += time.perf_counter() - start
        return buf.clone()

    def to_device(self, key, host, device, dtype):
        """`host` (a CPU tensor) converted to `dtype` on `device`. For a CUDA
        device: the conversion into a pinned buffer and one asynchronous
        copy on the current stream."""
        if device.type != "cuda":
            return host.to(device=device, dtype=dtype)
        buf = self._buffer(key, host.numel(), dtype).view(host.shape)
        buf.copy_(host)
        out = buf.to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._events[key] = event
        return out
