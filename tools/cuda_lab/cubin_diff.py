#!/usr/bin/env python3
"""cubin_diff.py - which kernels a source change touched, without cuobjdump.

Compares two cubins kernel by kernel: each kernel's machine code (its ELF
section .text.NAME, hashed) and its register count (the EIATTR_REGCOUNT
entries of .nv.info). Names are compared with the anonymous namespace's
per-file hash removed, so that cubins compiled from two checkouts line up.
Make the cubins with the plugin's flags, once per side, e.g.:

  nvcc -O3 -DNDEBUG -DTESSERA_CUDA -D_GNU_SOURCE -std=c++17 -arch=sm_90 \\
      -I. -Iinclude -Islots -Ikernels -cubin -o /tmp/new.cubin \\
      plugins/cuda_gemv_fp8/cuda_gemv_fp8.cu

  tools/cuda_lab/cubin_diff.py /tmp/old.cubin /tmp/new.cubin [--all]

Prints the kernels whose code differs (old -> new bytes and registers, and
the blocks of 256 threads that fit a multiprocessor by registers), then
those only one side has; --all lists every kernel. Exit status 0 when the
two hold the same code, 1 when not, 2 on bad input. (BENCHMARKS.md,
thirty-seventh session: three loads of cuda_gemv_fp8 changed the code of
224 of its 236 kernels and the registers of 146.)
"""
import hashlib
import re
import struct
import sys


def sections(data):
    """[(name, offset, size)] of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdr = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = hdr[shstrndx][4]

    def cstr(at):
        return data[at:data.index(b"\0", at)].decode()

    return [(cstr(names_at + h[0]), h[4], h[5]) for h in hdr]


def regcounts(data, secs):
    """{kernel name: registers} from .nv.info's EIATTR_REGCOUNT (0x2f) entries."""
    by = {n: (o, s) for n, o, s in secs}
    if ".symtab" not in by or ".strtab" not in by or ".nv.info" not in by:
        return {}
    so, ss = by[".symtab"]
    to, _ = by[".strtab"]
    syms = []
    for i in range(ss // 24):
        st_name, = struct.unpack_from("<I", data, so + 24 * i)
        syms.append(data[to + st_name:data.index(b"\0", to + st_name)].decode())
    p, size = by[".nv.info"]
    end, regs = p + size, {}
    while p < end:
        fmt, attr = data[p], data[p + 1]
        p += 2
        if fmt == 4:  # EIFMT_SVAL: a 16-bit size, then the value
            sz, = struct.unpack_from("<H", data, p)
            p += 2
            if attr == 0x2F and sz >= 8:
                sym, val = struct.unpack_from("<II", data, p)
                if sym < len(syms):
                    regs[syms[sym]] = val
            p += sz
        elif fmt == 3:  # EIFMT_HVAL: 16 bits
            p += 2
        elif fmt == 2:  # EIFMT_BVAL: 8 bits
            p += 1
    return regs


def kernels(path):
    """{normalised name: (code bytes, md5, registers)}."""
    data = open(path, "rb").read()
    secs = sections(data)
    regs = {re.sub(r"_GLOBAL__N__[0-9a-f_]+", "ANON", k): v for k, v in regcounts(data, secs).items()}
    out = {}
    for name, off, size in secs:
        if name.startswith(".text."):
            k = re.sub(r"_GLOBAL__N__[0-9a-f_]+", "ANON", name[6:])
            out[k] = (size, hashlib.md5(data[off:off + size]).hexdigest(), regs.get(k))
    return out


def blocks(regs):
    """Blocks of 256 threads a multiprocessor's 65,536 registers hold (8-register steps)."""
    return None if not regs else 65536 // (((regs + 7) // 8 * 8) * 256)


def main(argv):
    args = [a for a in argv[1:] if a != "--all"]
    if len(args) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: cubin_diff.py OLD.cubin NEW.cubin [--all]", file=sys.stderr)
        return 2
    try:
        old, new = kernels(args[0]), kernels(args[1])
    except (OSError, ValueError, struct.error) as e:
        print("cubin_diff.py: %s" % e, file=sys.stderr)
        return 2
    differ = [k for k in old if k in new and old[k][1] != new[k][1]]
    for k in sorted(old if "--all" in argv else differ):
        if k not in new:
            continue
        (b0, _, r0), (b1, _, r1) = old[k], new[k]
        mark = "*" if k in differ else " "
        print("%s %6d -> %6d bytes, %s -> %s registers (%s -> %s blocks of 256) %s"
              % (mark, b0, b1, r0, r1, blocks(r0), blocks(r1), k))
    only = sorted(set(old) ^ set(new))
    for k in only:
        print("only in %s: %s" % (args[0] if k in old else args[1], k))
    regs_moved = sum(1 for k in old if k in new and old[k][2] != new[k][2])
    print("%d kernels in common, %d with other code, %d with other registers, %d on one side only"
          % (len(set(old) & set(new)), len(differ), regs_moved, len(only)))
    return 0 if not differ and not only else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
