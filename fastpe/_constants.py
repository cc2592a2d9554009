"""Constants shared by the Python layer and the compiled kernels, defined once here.

setup.py writes them into fastpe/_kernels/_constants.pxi (C enums and globals) for the
kernels at every build, so neither side keeps a copy that could drift from the other.
Plain literals only: setup.py reads this file without importing fastpe.
"""

# Positions at or past this are refused for sinusoidal and rotary angles: past it the
# float64 angle position * frequency carries a rounding error above float32 precision.
MAX_ANGLE_POSITION = 2**32

# The largest inverse frequency whose angle stays a finite float64 for every int64
# position (float64's largest finite value / 2**63).
MAX_INV_FREQ = 1.7976931348623157e308 / 2.0**63

# Positions of another integer dtype, or in a list, converted on the kernels' stack.
POSITIONS_STACK = 512

# Dimensions the compiled entries take in an operand (ALiBi scores: five leading dims
# before heads, q_len and k_len).
VIEW_DIMS = 8

# Position axes of multi-axis RoPE (M-RoPE, 2D vision RoPE; HunYuan-VL has 4).
MAX_AXES = 16

# Thread counts up to this are always valid requests (fastpe._threads.MAX_THREADS is
# this or 8 per CPU, whichever is larger): the compiled RoPE entry accepts them unchecked.
MAX_THREADS_FLOOR = 256

# Dynamic NTK frequencies are formed as plain * high[i // SPLIT] * low[i % SPLIT]
# (two short tables of exp), in the same order by both backends, hence the same bits.
DYNAMIC_SPLIT = 8
DYNAMIC_PAIRS_STACK = 512

# T5's gathers are bound by the core and by scattered reads rather than by streaming
# bandwidth, so a team pays off on fewer bytes than fastpe._threads.SERIAL_BYTES (set by
# streaming passes): on the 2-vCPU Intel Xeon two threads took 0.65-0.69x the time of one
# on a T5 table of 1 MiB of float32 written, where streaming passes of 2 MiB took
# 1.2-1.35x. Each byte of the scores counts this many times (twice that when they are
# read and written).
T5_BYTES_WEIGHT = 4

# RoPE layouts and storage dtypes, as the kernels switch on them.
LAYOUT_CODES = {"bshd": 0, "bhsd": 1, "shd": 2}
STORAGE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
