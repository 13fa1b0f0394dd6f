"""The name transformers gives a forward's KV cache: `cache` in the releases the project pins,
`past_key_values` before them (transformers 5.17, which a GPU image we target still has).

The newer releases still take the old name, with a deprecation warning; 5.17 knows only the old
one. So the argument and the output field are named after the installed release, here, once.
"""

from transformers.modeling_outputs import CausalLMOutputWithPast

CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
