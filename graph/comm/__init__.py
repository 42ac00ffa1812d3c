"""Communication: where groups sit on nodes and calibration of a cluster spec on this machine.

The cost model itself, the α-β price of each call, is ``prism.peers.comm_model``: virtual peers
price their calls with it too (a capture's holds, ``prism.peers.clock.HoldingClock``)."""
