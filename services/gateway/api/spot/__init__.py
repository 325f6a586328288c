"""The provider's spot offerings: idle GPUs of a pool sold on the spot market."""
