"""procgroup over MPI (mpi4py): every op is the native MPI call on the caller's buffer."""
