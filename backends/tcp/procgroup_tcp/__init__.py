"""procgroup over TCP sockets."""
