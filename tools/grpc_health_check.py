#!/usr/bin/python3
"""A grpc_health_probe for bnps servers, over Debian's python3-grpcio.

    tools/grpc_health_check.py 127.0.0.1:7000 [SERVICE]

Calls grpc.health.v1.Health/Check (SERVICE: default "", the server as a
whole; or bnps.proto.ParameterServer) and prints the status. Exit status: 0
for SERVING, 1 for any other status or a failed call, 2 for bad arguments.
The messages are encoded by hand (two fields), so no generated code is needed.
Plaintext only: for TLS use grpc_health_probe -tls.
"""

import sys

import grpc

STATUSES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def check(address, service="", timeout=5.0):
    """The status name, e.g. "SERVING"; raises grpc.RpcError on failure."""
    name = service.encode()
    if len(name) > 127:
        raise ValueError("service name too long")
    request = b"\x0a" + bytes([len(name)]) + name if name else b""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check")
        response = call(request, timeout=timeout)
    # HealthCheckResponse { ServingStatus status = 1; } (0 is not sent)
    status = response[1] if len(response) >= 2 and response[0] == 0x08 else 0
    return STATUSES.get(status, str(status))


def main(argv):
    if len(argv) not in (2, 3) or argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        status = check(argv[1], argv[2] if len(argv) == 3 else "")
    except grpc.RpcError as e:
        print("%s: %s: %s" % (argv[1], e.code().name, e.details()))
        return 1
    print("%s: %s" % (argv[1], status))
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
