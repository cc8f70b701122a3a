"""miles (Megatron + SGLang + Ray): render its launch, parse its logs."""
