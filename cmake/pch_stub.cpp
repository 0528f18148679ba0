// Compiles the precompiled header once for the project's executables.
