"""Weight transfer, learner -> every generator engine: driver side (transfer), learner side (sender), engine
side (receiver), the collective under both (collective), and the parity check that a sync landed (parity)."""
