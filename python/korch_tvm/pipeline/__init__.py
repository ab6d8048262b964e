"""The stock and Korch compile paths, and compile_model that runs one of them."""
