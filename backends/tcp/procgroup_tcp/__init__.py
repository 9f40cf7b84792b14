"""procgroup over TCP sockets, built on procgroup.backend.

Layers, each importing only those above it in this list: ``_wire`` (frames),
``_conn`` (the mesh, one Peer per remote rank), ``_match`` (matching frames to
receives), ``_shm`` (collectives in shared memory on one host), ``_collectives``
(the pipelined ring over the sockets), ``channel`` (TcpChannel composes them), and
``plugin`` (the entry point).
"""
