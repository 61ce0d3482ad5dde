"""A TCP echo server for the test bed's tests: `echo_server.py IP PORT`
prints "ready" once listening and echoes every connection's bytes back."""

import socket
import sys
import threading


def serve(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with sock:
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                return
            if not data:
                return
            sock.sendall(data)


def main():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((sys.argv[1], int(sys.argv[2])))
    listener.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
