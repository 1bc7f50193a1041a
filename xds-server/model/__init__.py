"""What every layer of the control plane speaks: the proxy (node) it translates
for and serves, and the xDS type URLs and snapshot shape. Imports nothing else
of the control plane, so translation, ADS and the tools all sit above it."""
