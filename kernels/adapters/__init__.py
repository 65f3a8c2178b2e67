"""Registry adapters of the kernels in this package, one module per adapter (`mlstm_torch`,
`tfla_exp`, `tfla_sig`, `limit_chunk`); the mLSTM family's shared parts are in `_mlstm`."""
