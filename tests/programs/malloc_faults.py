"""The page faults of two rounds of the same allocations (512 blocks of 64 KiB, written, freed):
the second costs none where glibc keeps the freed memory (ddlctl's MALLOC_TOP_PAD_ for tasks), about
as many as the first where it hands it back to the kernel (glibc's default). tests/system/test_prefork.py."""

import ctypes
import json
import resource

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE, COUNT = 64 * 1024, 512


def faults_of_a_round() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(SIZE) for _ in range(COUNT)]
    for block in blocks:
        ctypes.memset(block, 1, SIZE)
    for block in reversed(blocks):
        libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def two_rounds() -> dict[str, int]:
    """The page faults of a first and a second round."""
    return {"first": faults_of_a_round(), "second": faults_of_a_round()}


if __name__ == "__main__":
    print(json.dumps(two_rounds()))
