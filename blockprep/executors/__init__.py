"""Reference decode executors that run a real model step from blockprep's prepared buffers."""
