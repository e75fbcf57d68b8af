"""Evidence the rules weigh, apart from the rules themselves: which samples of a batch are suspect
(:mod:`~forensics.detect.evidence.suspects`), whether the grad norm moved before the loss
(:mod:`~forensics.detect.evidence.precedence`), and how much of the loss's jumpiness the batch's bucket explains
(:mod:`~forensics.detect.evidence.jumpiness`)."""
