"""The launcher's --export (tools/bnps_launch.py): once the workers have
finished, bnps_status --export reads the job's servers, which still serve
(the launcher starts them with --keep_serving), and writes the model as
safetensors, with the workers' token and TLS files."""

import os
import subprocess


def status_path(bin_dir):
    return os.path.join(bin_dir, "tools", "bnps_status")


# The workers' own security flags, which bnps_status reads as they do.
CLIENT_SECURITY_FLAGS = ("--tls_ca", "--tls_cert", "--tls_key")


def export_command(args, extra, addresses):
    """bnps_status --export of the job's servers, with the workers' token and
    TLS files."""
    cmd = [status_path(args.bin_dir), "--servers=" + ",".join(addresses),
           "--job=" + args.job, "--export=" + os.path.abspath(args.export),
           "--timeout_ms=60000"]
    if args.token_file:
        cmd.append("--token_file=" + args.token_file)
    cmd += [f for f in extra if f.split("=", 1)[0] in CLIENT_SECURITY_FLAGS]
    return cmd


def run_export(args, extra, addresses, console):
    """Runs the export while the servers still serve (they run with
    --keep_serving); returns a problem message, or None."""
    cmd = export_command(args, extra, addresses)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "the export failed: %s" % e
    for line in (r.stdout + r.stderr).splitlines():
        console.line(line)
    if r.returncode != 0:
        return "the export to %s failed (bnps_status exit status %d)" % (
            args.export, r.returncode)
    return None
