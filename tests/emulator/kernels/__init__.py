"""FlyDSL kernels written for the emulator's own tests (compiled for gfx950 on the CPU)."""
