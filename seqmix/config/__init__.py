"""Everything that knows Hydra and OmegaConf: the ``conf/`` root, resolvers, the mixer group, and turning a composed
config into built objects (data module, model, task). Nothing below this layer imports it."""
