"""Vision encodings (PEG, axial, 2D sinusoidal, learned 2D, 2D RoPE, 2D relative bias)."""
