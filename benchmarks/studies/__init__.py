"""Studies that settled their question: modules and drivers only benchmarks and tests use."""
