"""The communication model: the α-β cost of each call, where groups sit on nodes, calibration."""
