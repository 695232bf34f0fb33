"""The parameter words of a program's layers (:class:`~hwonnx.hdl.layouts.ParamLayout`: a
bias, multiplier and shift per output channel, ``cols`` channels a word), packed once per
channels' values for every lowering of a build (:func:`param_word`)."""

__all__ = ["param_word", "packed_param_word"]


def param_word(bias, mult, shift, layout) -> int:
    """One parameter word in the HDL's :class:`~hwonnx.hdl.layouts.ParamLayout` ``layout``;
    unused channels hold (0, 0, 1). Kept for the next lowerings (:data:`_WORDS`)."""
    key = (type(layout), layout.length, bias, mult, shift)
    word = _WORDS.get(key)
    if word is None:
        if len(_WORDS) >= _CACHE:
            _WORDS.clear()
        word = _WORDS[key] = packed_param_word(bias, mult, shift, layout)
    return word


#: Parameter words packed so far, by layout (a :class:`~hwonnx.hdl.layouts.ParamLayout`
#: is its number of channels: comparing Amaranth layouts by their structure took most of
#: 2.3 s on ResNet-18's words) and channels' values: the lowerings of a sizing (``fitting``,
#: a dozen for a large model with an external memory) store the same words again, and
#: Amaranth's Layout.const takes about 1 ms a word (ResNet-18: 3,584 words, 4.5 s).
#: Bounded to :data:`_CACHE` words.
_WORDS: "dict[tuple, int]" = {}
_CACHE = 1 << 16


def packed_param_word(bias, mult, shift, layout) -> int:
    """:func:`param_word`, packed by ``layout``."""
    channels = [{"bias": int(bias[c]), "mult": int(mult[c]), "shift": int(shift[c])}
                if c < len(bias) else {"bias": 0, "mult": 0, "shift": 1}
                for c in range(layout.length)]
    return layout.const(channels).as_value().value
