"""The accelerator: buffers, engines and the instruction dispatcher."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..isa import Op
from ..config import ArchConfig
from .accumulate import Accumulators
from .array import SystolicArray
from .dma import DmaEngine
from .extmem import ext_port
from .eltwise import EltwiseEngine
from .banks import BankedMemory
from .bram import RegisteredRAM, buffer_read_latency
from .feeder import Feeder, feed_delay
from .fetch import NarrowFetch, WideFetch
from .program_ram import ProgramRAM
from .layouts import InstrLayout, ParamLayout
from .loader import WeightLoader
from .post import PostProcessor
from .walker import TileWalker
from .dispatch import Dispatcher, handoff_latency

__all__ = ["Accelerator", "host_port"]


def host_port(config: ArchConfig) -> wiring.Signature:
    """The accelerator's port for its host (a board's host bridge, a simulation harness) as
    the host drives it: ``start`` runs the program; ``busy``, ``done`` and ``cycles``; the
    activation buffer written (``act_we``, ``act_addr``, ``act_data``) and read
    (``act_raddr``; ``act_rdata`` :func:`~hwonnx.hdl.bram.buffer_read_latency` cycles later)
    while the accelerator is not busy; with a
    program memory loaded at run time (``prog_width``), its words (``prog_we``,
    ``prog_addr``, ``prog_data``)."""
    members = {"start": Out(1), "busy": In(1), "done": In(1), "cycles": In(32),
               "act_we": Out(1), "act_addr": Out(range(config.act_depth)),
               "act_data": Out(config.rows * 8), "act_raddr": Out(range(config.act_depth)),
               "act_rdata": In(config.rows * 8)}
    if config.runtime_program:
        members.update(prog_we=Out(1), prog_addr=Out(range(config.prog_words)),
                       prog_data=Out(config.prog_word_bits))
    return wiring.Signature(members)


class _NoEltwise:
    """The signals of :class:`EltwiseEngine` for an accelerator without one: always idle."""

    def __init__(self, config: ArchConfig):
        self.idle, self.act_en, self.acc_we = Const(1), Const(0), Const(0)
        self.act_addr, self.acc_addr = Const(0, config.act_addr_bits), \
            Const(0, config.acc_addr_bits)
        self.acc_data = [Const(0, 32)] * config.cols
        self.act_data = Signal(data.ArrayLayout(signed(8), config.rows))

class Accelerator(wiring.Component):
    """The whole accelerator for one :class:`~hwonnx.config.ArchConfig`.

    The model is data, not hardware: the program, weights and post-processing parameters are
    written through the ``host_*`` ports (or baked in as initial contents with ``images``), so
    one build of this component runs every model. A pulse on ``start`` runs the program from
    address 0; ``done`` rises when its ``END`` instruction retires and stays high until the
    next ``start``. ``cycles`` counts the cycles from ``start`` to ``done``.

    Members
    -------
    host : ``In(host_port(config))``: start, status, the activation buffer (and a program
        memory loaded at run time) for the host.
    host_<buf>_we, host_<buf>_addr, host_<buf>_data : write a whole word of buffer ``<buf>``
        (``prog`` unless loaded through ``host``, ``wgt``, ``par``, and ``lut``, the
        activation tables, when ``lut_tables`` is not 0) while the accelerator is not busy:
        the images a simulation harness loads (a board has them as initial contents).
    debug_dispatched : ``Out(32)``: instructions dispatched since ``start`` (the index of the
        next one, so the last one dispatched is ``debug_dispatched - 1``).
    debug_busy : ``Out(4)``: bit 0 the weight loader is loading, bit 1 the feeder holds or
        streams a MATMUL or the element-wise engine runs an ELTW, bit 2 the post-processor is
        working, bit 3 the dispatcher holds an instruction that its engine cannot take yet.
        Read-only status for a simulation harness that stops a run which does not finish;
        nothing else reads them, so synthesis removes their logic from a board design.
    ext : ``Out(ext_port(cols * 8, burst))``, with ``ext_memory``: the external memory, for
        the DMA engine (``hdl/extmem.py``).
    """

    def __init__(self, config: ArchConfig, images: "dict[str, list[int]] | None" = None,
                 logic_products: int = 0):
        self._config = config
        self._images = dict(images or {})
        self._logic_products = logic_products       # hdl/array.py: for a board build
        unknown = set(self._images) - set(config.buffers)
        if unknown:
            raise ValueError(f"Unknown buffer images {sorted(unknown)}")
        if config.runtime_program and "prog" in self._images:
            raise ValueError("A narrow program memory (prog_width) has no initial contents: "
                             "the host loads the program at run time")
        members = {"host": In(host_port(config))}
        for name in config.buffers:
            if name == "act" or (name == "prog" and config.runtime_program):
                continue                # through ``host``
            depth, width = config.buffer_shape(name)
            members[f"host_{name}_we"] = In(1)
            members[f"host_{name}_addr"] = In(range(depth))
            members[f"host_{name}_data"] = In(width)
        members["debug_dispatched"] = Out(32)
        members["debug_busy"] = Out(4)
        if config.ext_memory:           # the external memory's port (hdl/extmem.py)
            members["ext"] = Out(ext_port(config.cols * 8, config.ext_timing.burst))
        super().__init__(members)

    @property
    def config(self) -> ArchConfig:
        return self._config

    def _init(self, shape, name: str) -> list:
        """The initial words of buffer ``name`` (its image from the program)."""
        return [data.Const(shape, word) for word in self._images.get(name, [])]

    def elaborate(self, platform):
        m = Module()
        cfg = self.config

        def buffer(name, shape):
            depth, _ = cfg.buffer_shape(name)
            mem = Memory(shape=shape, depth=depth, init=self._init(shape, name))
            m.submodules[f"{name}_buf"] = mem
            return mem

        def registered(name, shape):
            depth, _ = cfg.buffer_shape(name)
            mem = RegisteredRAM(shape, depth, init=self._init(shape, name))
            m.submodules[f"{name}_buf"] = mem
            return mem

        # The program (but in the compact datapath) and the parameters are read through the
        # block RAMs' output registers (hdl/bram.py); the weights through banks of their own.
        prog = None
        if not cfg.runtime_program:
            prog = (buffer if cfg.compact else registered)("prog", InstrLayout())
        wgt = BankedMemory(data.ArrayLayout(signed(8), cfg.cols), cfg.wgt_depth,
                           self._init(data.ArrayLayout(signed(8), cfg.cols), "wgt"),
                           banked=not cfg.compact)
        m.submodules.wgt_buf = wgt
        par = registered("par", ParamLayout(cfg))
        # The activations through the block RAMs' output registers too (but in the compact
        # datapath): from a block's output (5.6 ns from the clock on a ULX3S-85F) through the
        # multiplexer between the blocks into the element-wise engine's register was the
        # critical path of an IC ResNet-8 build (84.5 MHz, 11.8 ns).
        act_word = data.ArrayLayout(signed(8), cfg.rows)
        if cfg.compact:
            act = buffer("act", act_word)
        else:
            depth, _ = cfg.buffer_shape("act")
            m.submodules.act_buf = act = RegisteredRAM(act_word, depth,
                                                       init=self._init(act_word, "act"),
                                                       granularity=1)

        m.submodules.array = array = SystolicArray(cfg, self._logic_products)
        m.submodules.feeder = feeder = Feeder(cfg)
        m.submodules.loader = loader = WeightLoader(cfg)
        m.submodules.post = post = PostProcessor(cfg, self._images.get("lut"))
        eltw = self._eltwise(m)
        if cfg.lut_tables:
            m.d.comb += [post.lut_we.eq(self.host_lut_we), post.lut_addr.eq(self.host_lut_addr),
                         post.lut_data.eq(self.host_lut_data)]

        # Host writes into program, weight and parameter buffers (a narrow program memory is
        # written through the fetch unit's port: see below); the DMA engine's into the weight
        # and parameter buffers and, paging a program, the program memory (only while the
        # program runs, when the host does not write).
        dma = self._dma(m)
        for name, mem in (("prog", prog), ("wgt", wgt), ("par", par))[cfg.runtime_program:]:
            port = mem.write_port() if isinstance(mem, Memory) else mem.write
            addr, data_, we = (getattr(self, f"host_{name}_{x}") for x in ("addr", "data", "we"))
            if dma is not None:
                ours = [getattr(dma, f"{name}_{x}") for x in ("we", "addr", "data")]
                addr, data_, we = (Mux(ours[0], ours[1], addr), Mux(ours[0], ours[2], data_),
                                   ours[0] | we)
            m.d.comb += [port.addr.eq(addr), port.data.eq(data_), port.en.eq(we)]

        # Activation buffer: the post-processor or the host writes, the feeder and host read;
        # addresses from ``act_depth`` on are the staging buffers' (:meth:`_staging`).
        running = Signal()
        engine_addr = Mux(eltw.act_en, eltw.act_addr, feeder.act_addr)
        engine_en = feeder.act_en | eltw.act_en
        act_r = act.read_port() if cfg.compact else act.read
        post_we, engine_data = self._staging(m, dma, post, engine_addr, engine_en,
                                             act_r.data)
        act_w = act.write_port(granularity=1) if cfg.compact else act.write
        with m.If(self.host.act_we):
            m.d.comb += [act_w.addr.eq(self.host.act_addr), act_w.data.eq(self.host.act_data),
                         act_w.en.eq(~0)]
        with m.Else():
            m.d.comb += [act_w.addr.eq(post.out_addr), act_w.data.eq(post.out_data),
                         act_w.en.eq(post_we)]
        # One read port: the feeder's or the element-wise engine's (never both at once: the
        # engine starts only when the feeder is drained) while the program runs, the host's
        # otherwise (a second port would double the buffer's block RAMs, its largest user on
        # a board). Behind the output registers it reads in every cycle: no reader keeps a
        # word over a cycle without a read (a padding word is replaced, the engines' words
        # are in registers of their own), and the enable into every block's CEB from the
        # feeder's counters was the critical path of an ECPIX-5 build (142 MHz, 7.0 ns).
        m.d.comb += [act_r.addr.eq(Mux(running, engine_addr, self.host.act_raddr)),
                     act_r.en.eq(~running | engine_en if cfg.compact else 1),
                     self.host.act_rdata.eq(act_r.data), eltw.act_data.eq(engine_data)]

        # Weight tiles into the array.
        wiring.connect(m, loader.wgt, wgt.read)
        m.d.comb += [array.wload_en.eq(loader.wload_en), array.wload_row.eq(loader.wload_row),
                     array.wload_bank.eq(loader.wload_bank),
                     array.wload_data.eq(loader.wload_data)]

        # Activations into the array through feed_delay - (the buffer's read latency)
        # registers (none: straight from the buffer); padding reads as the zero point.
        feed_word = engine_data
        for stage in range(feed_delay(cfg) - buffer_read_latency(cfg)):
            registered = Signal(data.ArrayLayout(signed(8), cfg.rows), name=f"feed_word_{stage}")
            m.d.sync += registered.eq(feed_word)
            feed_word = registered
        for lane in range(cfg.rows):
            m.d.comb += array.feed[lane].eq(Mux(feeder.feed_pad, feeder.feed_zp,
                                                feed_word[lane]))
        m.d.comb += [array.feed_bank.eq(feeder.feed_bank), array.feed_dw.eq(feeder.feed_dw)]

        # Accumulators: read-modify-write behind the array, read by the post-processor; the
        # element-wise engine writes them too (only while the feeder is drained).
        m.submodules.acc = acc = Accumulators(cfg)
        m.d.comb += [acc.raddr.eq(feeder.acc_raddr), acc.we.eq(feeder.acc_we),
                     acc.waddr.eq(feeder.acc_waddr), acc.first.eq(feeder.acc_first),
                     acc.max.eq(feeder.acc_max),
                     acc.sums.eq(array.sums), acc.ew_we.eq(eltw.acc_we),
                     acc.ew_addr.eq(eltw.acc_addr), acc.post_addr.eq(post.acc_addr),
                     post.acc_data.eq(acc.post_data)]
        for c in range(cfg.cols):
            m.d.comb += acc.ew_data[c].eq(eltw.acc_data[c])

        wiring.connect(m, post.par, par.read)

        # The instruction on offer: while the tile walker walks a LOOP, its micro-instruction,
        # otherwise the stored one; the dispatcher hands it to its engine.
        fetched_fire = Signal()       # the dispatcher takes the stored instruction
        fresh, boot = self._paging(m, dma)
        if cfg.runtime_program:
            stored, stored_valid, stored_decoded = self._narrow_fetch(m, running, fetched_fire)
        else:
            stored, stored_valid, stored_decoded = self._wide_fetch(m, prog, running,
                                                                    fetched_fire, fresh)
        m.submodules.dispatcher = disp = Dispatcher(cfg)
        offer = disp.instr
        fire = Signal()
        m.d.comb += fire.eq(offer.valid & offer.ready)
        if cfg.walker:
            m.submodules.walker = walker = TileWalker(cfg)
            walking = walker.instr.valid
            m.d.comb += [
                offer.payload.eq(Mux(walking, walker.instr.payload.as_value(),
                                     stored.as_value())),
                offer.valid.eq(walking | stored_valid),
                disp.decoded.eq(Mux(walking, walker.decoded.as_value(),
                                        stored_decoded.as_value())),
                walker.instr.ready.eq(offer.ready),
                fetched_fire.eq(fire & ~walking),
                walker.start.eq(self.host.start), walker.load.eq(fetched_fire),
                walker.word.eq(stored.as_value()), walker.word_valid.eq(stored_valid),
            ]
        else:
            m.d.comb += [offer.payload.eq(stored), offer.valid.eq(stored_valid),
                         disp.decoded.eq(stored_decoded), fetched_fire.eq(fire)]
        wiring.connect(m, disp.loadw, loader.instr)
        wiring.connect(m, disp.matmul, feeder.instr)
        wiring.connect(m, disp.post, post.instr)
        if cfg.eltwise:
            wiring.connect(m, disp.eltw, eltw.instr)
        else:
            m.d.comb += disp.eltw.ready.eq(1)       # no element-wise engine: always idle
        m.d.comb += [disp.bank_free.eq(feeder.bank_free), disp.drained.eq(feeder.drained),
                     disp.loadw_free_next.eq(loader.free_next),
                     disp.mm_completed.eq(feeder.completed),
                     feeder.post_idle.eq(disp.posts_done)]
        if dma is not None:
            wiring.connect(m, disp.dma, dma.instr)
            m.d.comb += [disp.dma_idle.eq(dma.idle), disp.dma_slot_free.eq(dma.slot_free),
                         disp.boot.eq(boot)]

        with m.If(self.host.start):
            m.d.sync += [running.eq(1), self.host.done.eq(0), self.host.cycles.eq(0)]
        with m.Elif(running):
            m.d.sync += self.host.cycles.eq(self.host.cycles + 1)
            with m.If(fetched_fire & disp.decoded.op[Op.END]):
                m.d.sync += [running.eq(0), self.host.done.eq(1)]
        m.d.comb += self.host.busy.eq(running)

        # Read-only status for the simulation harness (see the class docstring).
        with m.If(self.host.start):
            m.d.sync += self.debug_dispatched.eq(0)
        with m.Elif(fire):
            m.d.sync += self.debug_dispatched.eq(self.debug_dispatched + 1)
        m.d.comb += self.debug_busy.eq(Cat(loader.busy if dma is None else loader.busy | ~dma.idle,
                                           feeder.pending | ~feeder.drained | ~eltw.idle,
                                           ~disp.post_idle, disp.blocked))
        return m

    def _dma(self, m):
        """The DMA engine on the external memory's read port, or None without one."""
        cfg = self.config
        if not cfg.ext_memory:
            return None
        m.submodules.dma = dma = DmaEngine(cfg, cfg.ext_timing)
        wiring.connect(m, dma.ext, wiring.flipped(self.ext))
        return dma

    def _staging(self, m, dma, post, engine_addr, engine_en, act_data):
        """The staging buffers (``ArchConfig.stage_in_depth``, ``stage_out_depth``; without
        them, none): the input one at activation addresses from ``act_depth``, written by the DMA
        engine's LOADA and read by the feeder and the element-wise engine, the output one
        after it, written by the post-processor and read by the DMA engine's STOREA. Each is
        its own memory, so a transfer never meets another engine at a port. Returns the
        post-processor's lane enables into the activation buffer and the data the feeder and
        the element-wise engine read (of the buffer their last enabled read addressed)."""
        cfg = self.config
        if not cfg.stage_in_depth:
            return post.out_we, act_data
        word = data.ArrayLayout(signed(8), cfg.rows)
        stage_in = Memory(shape=word, depth=cfg.stage_in_depth, init=[])
        stage_out = Memory(shape=word, depth=cfg.stage_out_depth, init=[])
        m.submodules.stage_in_buf, m.submodules.stage_out_buf = stage_in, stage_out
        in_base, out_base = cfg.stage_bases
        in_r, in_w = stage_in.read_port(), stage_in.write_port()
        out_r, out_w = stage_out.read_port(), stage_out.write_port(granularity=1)
        staged = Signal()               # the last enabled engine read was the input stage's
        with m.If(engine_en):
            m.d.sync += staged.eq(engine_addr >= in_base)
        in_data = in_r.data
        for stage in range(buffer_read_latency(cfg) - 1):   # as the activation buffer's
            staged_d = Signal(name=f"staged_{stage}")
            in_data_d = Signal.like(in_r.data, name=f"stage_in_data_{stage}")
            m.d.sync += [staged_d.eq(staged), in_data_d.eq(in_data)]
            staged, in_data = staged_d, in_data_d
        post_staged = post.out_addr >= out_base
        m.d.comb += [in_r.addr.eq(engine_addr - in_base), in_r.en.eq(engine_en),
                     in_w.addr.eq(dma.act_waddr - in_base), in_w.data.eq(dma.act_wdata),
                     in_w.en.eq(dma.act_we),
                     out_r.addr.eq(dma.act_raddr - out_base), out_r.en.eq(dma.act_ren),
                     dma.act_rdata.eq(out_r.data),
                     out_w.addr.eq(post.out_addr - out_base), out_w.data.eq(post.out_data),
                     out_w.en.eq(Mux(post_staged, post.out_we, 0))]
        return Mux(post_staged, 0, post.out_we), word(Mux(staged, in_data, act_data))

    def _paging(self, m, dma):
        """A paged program's signals (``prog_page``; otherwise constants): ``fresh`` is high
        when a read of the program memory shows what every LOADP wrote (the DMA engine idle
        in this cycle and the one before, with nothing in its hand-off register: its last word
        may be written in the cycle before it is idle); ``boot`` is high in the cycle after
        ``start``, when the dispatcher hands the DMA engine the LOADP of the first two pages
        (``Dispatcher.boot_word``) and dispatches nothing."""
        if not self.config.prog_page:
            return Const(1), Const(0)
        idle = dma.idle & ~dma.instr.valid if handoff_latency(self.config) else dma.idle
        seen = Signal(init=1)          # the engine was idle in the cycle before
        boot = Signal()
        m.d.sync += [seen.eq(idle), boot.eq(self.host.start)]
        return ~boot & idle & seen, boot

    def _wide_fetch(self, m, prog, running, fire, fresh):
        """The fetch unit over a program memory of whole instructions (``hdl/fetch.py``):
        returns the instruction on offer, its valid and it decoded."""
        m.submodules.fetch = fetch = WideFetch(self.config)
        wiring.connect(m, fetch.prog, prog.read_port() if isinstance(prog, Memory) else prog.read)
        m.d.comb += [fetch.start.eq(self.host.start), fetch.running.eq(running),
                     fetch.fresh.eq(fresh), fetch.instr.ready.eq(fire)]
        return fetch.instr.payload, fetch.instr.valid, fetch.decoded

    def _eltwise(self, m):
        """The element-wise engine, or without ``ArchConfig.eltwise`` an idle stand-in whose
        outputs are constants (synthesis removes what reads them)."""
        if self.config.eltwise:
            m.submodules.eltw = eltw = EltwiseEngine(self.config)
            return eltw
        return _NoEltwise(self.config)

    def _narrow_fetch(self, m, running, fire):
        """Fetch unit over a narrow program memory with one port shared by the host (while
        the accelerator is idle) and the fetch unit (single-port RAM: iCE40 SPRAM)."""
        cfg = self.config
        m.submodules.fetch = fetch = NarrowFetch(cfg)
        m.submodules.prog_buf = ram = ProgramRAM(cfg.prog_words, cfg.prog_width)
        m.d.comb += [ram.addr.eq(Mux(self.host.prog_we, self.host.prog_addr, fetch.mem_addr)),
                     ram.data.eq(self.host.prog_data), ram.we.eq(self.host.prog_we),
                     ram.re.eq(fetch.mem_en), fetch.mem_data.eq(ram.rdata),
                     fetch.start.eq(self.host.start), fetch.running.eq(running),
                     fetch.fire.eq(fire)]
        return fetch.instr, fetch.valid & running, fetch.decoded
