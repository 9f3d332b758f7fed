# Sourced by the benchmark scripts that start servers on loopback.
# free_port: prints a TCP port of 127.0.0.1 that was free a moment ago.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
