"""The systems simulators: what the methods need from the network and how they survive failures.

- `bandwidth`: compute utilization over one link and the bandwidth a target needs
  (`bandwidth_report`: the 198 → 0.84 Gbit/s reconstruction, notebook 05);
- `goodput`: a chaos simulator of millions of chips (`goodput_closed`: its closed forms;
  `goodput_report`: the 27% / 58% → 88% reproduction, notebook 06).

They share the training runs' link model and schedule (`diloco_lite.clock`) and depend on
nothing else of the training side.
"""
