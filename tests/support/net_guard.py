"""Run `specchat` (args as given) with every socket connection and DNS lookup outside loopback written to
$SPECCHAT_NET_LOG, so a test can assert the app never reaches beyond 127.0.0.1."""
import os
import socket
import sys

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_log = open(os.environ["SPECCHAT_NET_LOG"], "a", encoding="utf-8")


def _note(what: str) -> None:
    _log.write(what + "\n")
    _log.flush()


def _guard(connect):
    def guarded(self, address, *args):
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and host not in LOOPBACK:
            _note(f"connect {address}")
        return connect(self, address, *args)
    return guarded


socket.socket.connect = _guard(socket.socket.connect)
socket.socket.connect_ex = _guard(socket.socket.connect_ex)
_getaddrinfo = socket.getaddrinfo


def _lookup(host, *args, **kwargs):
    if host not in LOOPBACK and host is not None:
        _note(f"lookup {host}")
    return _getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _lookup

if __name__ == "__main__":
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/support/ -> .
    sys.path.insert(0, repo)
    from app.cli import main

    sys.argv = ["specchat", *sys.argv[1:]]
    sys.exit(main())
