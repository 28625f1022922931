"""Stand-in for PyPTO (the NPU compiler and runtime): the names upstream pypto-serving's modules
import at `9b1a264`, enough for its unit suite, which fakes every device call itself."""
