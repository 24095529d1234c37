//! Word lists of lcut's own for the RULER-style tasks: adjectives and nouns
//! (needle keys are `adjective-noun` pairs, as RULER's are), verbs for the
//! common-word lists, and the names the QA documents are made of.

/// Adjectives.
pub(crate) const ADJECTIVES: &[&str] = &[
    "able", "ancient", "angry", "bitter", "black", "bold", "brave", "bright", "broad", "broken",
    "busy", "calm", "careful", "cheap", "clean", "clever", "cold", "common", "cool", "crisp",
    "cruel", "curious", "damp", "dark", "deep", "dense", "dizzy", "dry", "dull", "eager", "early",
    "empty", "faint", "fair", "false", "famous", "fancy", "fast", "fierce", "flat", "fond",
    "fresh", "friendly", "frozen", "gentle", "giant", "glad", "golden", "grand", "green", "grey",
    "happy", "hard", "harsh", "heavy", "hidden", "hollow", "honest", "hot", "huge", "humble",
    "hungry", "icy", "idle", "jolly", "keen", "kind", "large", "late", "lazy", "light", "little",
    "lively", "lonely", "long", "loud", "lucky", "mad", "mellow", "merry", "mild", "modern",
    "narrow", "neat", "nervous", "new", "noble", "noisy", "odd", "old", "orange", "pale",
    "patient", "plain", "polite", "poor", "proud", "purple", "quick", "quiet", "rapid", "rare",
    "raw", "red", "rich", "rough", "round", "royal", "rusty", "sad", "safe", "salty", "sharp",
    "shiny", "short", "shy", "silent", "silly", "simple", "slow", "small", "smooth", "soft",
    "solid", "sour", "spare", "steady", "steep", "sticky", "stiff", "still", "strange", "strict",
    "strong", "sudden", "sunny", "sweet", "swift", "tall", "tame", "tender", "thick", "thin",
    "tidy", "tiny", "tough", "true", "ugly", "vast", "violet", "warm", "weak", "wet", "white",
    "whole", "wide", "wild", "wise", "wooden", "yellow", "young", "zealous",
];

/// Nouns.
pub(crate) const NOUNS: &[&str] = &[
    "anchor", "apple", "arch", "arrow", "badge", "bakery", "balloon", "banner", "barrel", "basket",
    "beacon", "bell", "bench", "blanket", "boat", "bottle", "bridge", "brush", "bucket", "button",
    "cabin", "camel", "candle", "canyon", "carpet", "castle", "cellar", "chair", "chimney",
    "cloud", "coin", "comet", "copper", "cottage", "crown", "crystal", "curtain", "desert",
    "diamond", "dolphin", "dragon", "drum", "eagle", "engine", "feather", "fence", "ferry",
    "fiddle", "field", "flag", "flute", "forest", "fountain", "garden", "gate", "glacier", "glove",
    "harbor", "hammer", "harp", "helmet", "hill", "honey", "horse", "island", "jacket", "jewel",
    "kettle", "kitten", "ladder", "lagoon", "lantern", "lemon", "letter", "lizard", "magnet",
    "maple", "market", "meadow", "mirror", "monkey", "mountain", "needle", "nest", "oasis",
    "ocean", "orchard", "otter", "paddle", "palace", "parrot", "pebble", "pencil", "pepper",
    "piano", "pillow", "planet", "pocket", "pond", "puzzle", "quarry", "rabbit", "raven", "ribbon",
    "river", "rocket", "saddle", "sailor", "scarf", "shadow", "shell", "shovel", "silver", "skate",
    "sparrow", "spider", "spoon", "statue", "stone", "storm", "stove", "sunset", "swan", "sword",
    "table", "teapot", "temple", "thimble", "thunder", "tiger", "timber", "tower", "trumpet",
    "tulip", "tunnel", "turtle", "umbrella", "valley", "velvet", "violin", "wagon", "walnut",
    "wand", "whale", "wheel", "whistle", "willow", "window", "wizard",
];

/// Verbs.
pub(crate) const VERBS: &[&str] = &[
    "accept", "admire", "answer", "arrive", "bake", "balance", "borrow", "bounce", "breathe",
    "build", "carry", "carve", "change", "chase", "climb", "collect", "count", "crawl", "dance",
    "deliver", "design", "dream", "drift", "enjoy", "escape", "explore", "fasten", "fetch",
    "float", "fold", "follow", "gather", "glide", "grow", "guard", "hurry", "imagine", "invent",
    "juggle", "jump", "knit", "laugh", "listen", "march", "measure", "melt", "mend", "observe",
    "offer", "paint", "pause", "plant", "polish", "pour", "practise", "protect", "pull", "push",
    "question", "reach", "relax", "remember", "repair", "rescue", "return", "roll", "sail",
    "scatter", "search", "settle", "shiver", "sketch", "slide", "smile", "sneeze", "sparkle",
    "spill", "stretch", "swim", "talk", "taste", "travel", "tremble", "trust", "twist", "visit",
    "wander", "wash", "whisper", "wiggle", "wonder", "worry", "wrap", "yawn",
];

/// First names of the QA documents' people.
pub(crate) const FIRST_NAMES: &[&str] = &[
    "Adela",
    "Bertram",
    "Cosima",
    "Dorian",
    "Edith",
    "Fabian",
    "Greta",
    "Hector",
    "Ingrid",
    "Jasper",
    "Katrin",
    "Leopold",
    "Marisol",
    "Nikolai",
    "Odile",
    "Percival",
    "Quilla",
    "Rupert",
    "Sabine",
    "Tobias",
    "Ursula",
    "Valentin",
    "Wilhelmina",
    "Xavier",
    "Yolanda",
    "Zachary",
];

/// Family names of the QA documents' people.
pub(crate) const LAST_NAMES: &[&str] = &[
    "Ashgrove",
    "Brambleton",
    "Corriveau",
    "Dunmore",
    "Elsworth",
    "Fairweather",
    "Galloway",
    "Hathersage",
    "Ivanova",
    "Jaramillo",
    "Kettleby",
    "Lindqvist",
    "Marchetti",
    "Northcote",
    "Ostrander",
    "Pemberton",
    "Quintero",
    "Rosenthal",
    "Stavely",
    "Thistlewood",
    "Underhill",
    "Vasquez",
    "Whitlock",
    "Yardley",
];

/// First halves of the QA documents' made-up place names.
pub(crate) const PLACE_HEADS: &[&str] = &[
    "Ash", "Bel", "Cor", "Dun", "Elm", "Fen", "Gar", "Hol", "Ives", "Kel", "Lin", "Mor", "Nor",
    "Pen", "Ros", "Sel", "Tal", "Wen", "Brack", "Crest", "Dor", "Harl", "Quen", "Thorn",
];

/// Second halves of the made-up place names.
pub(crate) const PLACE_TAILS: &[&str] = &[
    "brook", "bury", "combe", "dale", "ford", "ham", "holt", "ley", "mere", "stow", "thorpe",
    "wick", "worth", "gate", "marsh", "haven",
];

/// Trades of the QA documents' people.
pub(crate) const TRADES: &[&str] = &[
    "weaver",
    "miller",
    "blacksmith",
    "potter",
    "shipwright",
    "glassblower",
    "cartographer",
    "clockmaker",
    "brewer",
    "stonemason",
    "bookbinder",
    "tanner",
    "cooper",
    "chandler",
];

/// What the QA documents' towns are known for.
pub(crate) const PRODUCTS: &[&str] = &[
    "blue pottery",
    "copper kettles",
    "walnut furniture",
    "striped wool blankets",
    "plum brandy",
    "hand-painted tiles",
    "smoked trout",
    "lace collars",
    "silver buttons",
    "honey cakes",
    "rope ladders",
    "willow baskets",
    "glass marbles",
    "brass compasses",
    "goat cheese",
    "cedar canoes",
];
