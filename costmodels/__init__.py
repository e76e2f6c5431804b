"""Pure cost models: specs in, numbers out (no torch, no click, no file I/O at import)."""
