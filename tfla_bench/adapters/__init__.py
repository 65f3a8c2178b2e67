"""What every adapter builds on: the case (`workloads`), the adapter protocol and the registry
(`registry`), what adapters share (`support`: seeded inputs, availability probes) and the mLSTM
family's common parts (`mlstm`)."""
