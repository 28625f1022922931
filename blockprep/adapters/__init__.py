"""Model adapters: each turns a DecodeBatch into one model's persistent decode buffers."""
