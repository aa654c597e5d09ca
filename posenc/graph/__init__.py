"""Graph encodings (Laplacian eigenvector PE, random-walk SE, shortest-path bias)."""
