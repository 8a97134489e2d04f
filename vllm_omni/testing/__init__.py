"""The test kit, beside the layers (no library module imports it): random-weight checkpoints in the released layout,
synthetic codes and streams, eager reference decoders, the headless browser, the demo."""
