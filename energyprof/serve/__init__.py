"""The privileged reader: a small root service that hands RAPL counters (and, within range, power
knobs) to the members of one group over a Unix socket. protocol.py is shared with the client in
collect/sensors/served.py; server.py is the service; units/ holds its systemd unit files."""
