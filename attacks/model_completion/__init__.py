"""Model completion (Fu et al. 2022): the passive adversary completes its bottom model with a head
trained on a few labeled rows, then infers labels."""
