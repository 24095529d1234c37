//! Bland filler prose for the retrieval items: the paragraphs of
//! `fixtures/prompts/make_smollm2_prompts.py` (no digits, none of the facts the
//! questions ask about), drawn in a seeded order until a word budget is met.

use super::rng::Rng;

/// The filler paragraphs.
pub(crate) const PARAGRAPHS: &[&str] = &[
    "Most gardeners agree that good soil is the start of everything. In early spring the beds \
     are turned over with a fork, and a layer of compost is spread across the top. Worms do \
     much of the remaining work, pulling the rotted leaves down and leaving the earth loose \
     and dark. A bed prepared this way holds water well in a dry summer and drains quickly \
     after a storm. Beginners are often surprised by how much difference a single season of \
     care can make.",
    "Tomatoes are a favourite crop in small gardens because they reward patience. The seeds \
     are sown indoors on a sunny windowsill, and the young plants are moved outside once the \
     nights are warm. Each plant needs a sturdy cane and a loose tie, since the stems grow \
     heavy with fruit by late summer. Regular watering keeps the skins from splitting. Many \
     growers pinch out the side shoots so that the plant spends its strength on the main \
     stem.",
    "A small herb garden near the kitchen door is one of the most useful things a cook can \
     have. Rosemary and thyme are tough plants that survive dry spells and cold winters. Mint \
     grows so eagerly that it is best kept in a pot, or it will spread across the whole bed. \
     Parsley and chives need a little more water but give leaves for most of the year. A \
     handful of fresh herbs can lift even the plainest meal.",
    "The branch line that runs along the valley was built to carry slate from the quarries \
     down to the harbour. Later, passenger carriages were added, and for many years the \
     morning train was the only way to reach the market without a long walk. The track \
     follows the river closely, crossing it twice on low stone bridges. Today the line is \
     kept open by volunteers, who paint the stations each spring and sell tea from a small \
     hut beside the ticket office.",
    "Inside the old signal box, a row of tall iron levers stands along one wall. Each lever \
     is painted to show what it controls, and a brass plate above it says which signal or set \
     of points it moves. The signalman pulls them in a fixed order, and the heavy wires under \
     the floor work the signals far down the track. A bell on the shelf rings to announce \
     each train, and a logbook records the time it passes. The work is slow and careful, and \
     mistakes are rare.",
    "Travelling by train gives people time to look out of the window and watch the country go \
     by. Fields give way to woods, woods to small towns, and towns to long stretches of open \
     moor. Some passengers read or sleep, while others talk quietly with strangers about the \
     weather and the delays. The rhythm of the wheels on the rails has a calming effect, and \
     many regular travellers say they do their best thinking on the morning journey.",
    "Fog often settles over the lowlands on autumn mornings, when the air is still and the \
     ground has cooled overnight. From the hills it looks like a white sea, with the tops of \
     trees and church towers standing out like islands. Drivers slow down and turn on their \
     lamps, and the sounds of the town become soft and distant. By the middle of the morning \
     the sun usually burns through, and the fields appear again, wet and shining.",
    "Summer storms in the region tend to arrive in the late afternoon. The morning is hot and \
     heavy, clouds build slowly over the western ridge, and by tea time the sky has turned a \
     dark grey. The first sign is usually a cool gust of wind that lifts the dust along the \
     lanes. Then the rain comes all at once, loud on the roofs, and just as quickly it moves \
     on, leaving the air fresh and the gutters running.",
    "Winter in the valley is usually more damp than cold. Snow falls only a few times a year, \
     and it rarely stays for more than a day or two before turning to slush. The short \
     afternoons are spent indoors, and by four o'clock lights are shining in most windows. \
     Still, there are bright, frosty mornings when the grass is white and crisp underfoot, \
     and on those days the whole town seems to go out for a walk.",
    "Older residents of the valley still like to forecast the weather by watching the sky. A \
     red sunset is said to promise a fine day, while a ring around the moon warns of rain. \
     Cows lying down in a field are thought to mean a shower is coming, although nobody is \
     quite sure whether this is true. The forecast on the radio is more reliable, but the old \
     sayings are still repeated with a smile.",
    "A simple vegetable soup can be made from almost anything left in the kitchen at the end \
     of the week. An onion is softened slowly in a little oil, then carrots, celery and \
     potatoes are added and stirred until they begin to colour. Stock or plain water goes in \
     next, with a bay leaf and a pinch of salt. After half an hour of gentle simmering the \
     soup is ready, and it tastes even better the following day.",
    "Baking bread at home takes time but very little skill. Flour, water, salt and yeast are \
     mixed into a rough dough, which is kneaded until it becomes smooth and springy. The \
     dough then rests in a warm place until it has doubled in size. After shaping, it rises \
     again before going into a hot oven. The smell that fills the house during the last few \
     minutes of baking is reason enough for many people to keep making their own loaves.",
    "In the autumn, when the apple trees are heavy with fruit, many kitchens turn to baking \
     pies. The apples are peeled, cored and sliced thinly, then tossed with sugar and a \
     little cinnamon. A simple pastry of flour, butter and cold water is rolled out to line \
     the dish and cover the top. A few slits are cut in the lid to let the steam escape. \
     Served warm with cream, an apple pie is one of the most comforting dishes of the season.",
    "The town of Millbrook Ford grew up around a shallow crossing on the river, where \
     travellers could lead their carts through the water in summer. A mill was built beside \
     the ford, and a handful of cottages soon followed. For a long time the place had no \
     church of its own, and families walked across the fields to the next village on Sundays. \
     The old ford is still visible when the river runs low, a line of flat stones just under \
     the surface.",
    "Over the years Millbrook Ford became known for its weekly market. Farmers from the \
     surrounding hills brought cheese, wool and eggs, and traders came up from the coast with \
     salt and cloth. The market square was paved with cobbles, and a covered hall was built \
     at one end so that business could continue in bad weather. The hall still stands, though \
     it now holds a cafe, a bookshop and a small room where the local history society meets.",
    "Like many river towns, Millbrook Ford has a long history of floods. The oldest houses \
     have their front steps raised well above the street, and marks painted on the wall of \
     the mill show how high the water rose in the worst years. After one particularly wet \
     winter, the townspeople built an earth bank along the meadows to hold the river back. It \
     has worked well, although the lower lane still floods once or twice each decade.",
    "Every year at the end of summer, Millbrook Ford holds a small festival on the meadow by \
     the river. There are stalls selling jam and cakes, a tug of war between the two ends of \
     the town, and a brass band that plays the same tunes it has played for as long as anyone \
     can remember. In the evening lanterns are hung along the bank, and families sit on \
     blankets until it grows dark and the air turns cool.",
    "Anyone who sits quietly in a garden for half an hour will notice how busy the birds are. \
     Sparrows squabble in the hedge, a blackbird turns over leaves on the lawn, and tits hang \
     upside down from the feeder. In spring the activity doubles as pairs build nests and \
     then search for food for their young. Keeping a simple notebook of which birds appear, \
     and when, is a pleasant hobby that requires nothing more than patience.",
    "The reading room of an old library has a particular kind of quiet. Tall windows let in a \
     pale light, long tables are lined with reading lamps, and the only sounds are the \
     turning of pages and the occasional creak of a chair. Visitors come for many reasons: to \
     study, to look up a family record, to read the newspapers or simply to sit somewhere \
     warm. The librarians know most of the regular readers by sight and greet them with a \
     nod.",
    "The footpath to the top of the hill begins behind the last house in the lane. At first \
     it climbs gently through a wood of beech and oak, where the ground is soft with fallen \
     leaves. Higher up the trees thin out, and the path crosses open grassland grazed by \
     sheep. From the summit on a clear day it is possible to see the whole valley laid out \
     below, with the river shining between the fields and the town a cluster of roofs.",
    "Keeping a bicycle in good order is mostly a matter of small, regular jobs. The chain \
     should be cleaned and oiled every few weeks, especially after riding in the rain. Tyres \
     lose air slowly and need to be pumped up before long trips. Brake blocks wear down over \
     time and are easy to replace with a few basic tools. A bicycle that is looked after in \
     this way will run quietly and smoothly for many years.",
    "At the mouth of the river, a small harbour shelters a few fishing boats and a larger \
     number of pleasure craft. At low tide the boats rest on the mud, leaning at odd angles, \
     and gulls walk between them looking for scraps. When the tide returns they lift and turn \
     to face the current. The harbour wall is a popular place for an evening stroll, and in \
     summer children sit along its edge with lines, hoping to catch crabs.",
    "Woodworking teaches patience more quickly than almost any other hobby. Each piece of \
     timber has its own grain, and a cut made against it will tear rather than slice. Joints \
     must be marked carefully and cut slowly, because a small mistake at the start grows \
     larger as the work goes on. The reward comes at the end, when the parts fit together \
     snugly and a coat of oil brings out the colour of the wood.",
    "The river changes its character many times on its way to the sea. Near its source it is \
     a narrow stream that tumbles over rocks between steep banks of fern. Lower down it \
     widens and slows, winding through meadows where herons stand motionless in the shallows. \
     By the time it reaches the town it is broad and brown, carrying branches and leaves from \
     the hills after every heavy rain.",
];

/// Filler of at least `words` words: whole paragraphs in a seeded order
/// (reshuffled when the pool runs out), trimmed to the paragraph that
/// reaches the budget.
pub(crate) fn filler(rng: &mut Rng, words: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut count = 0;
    while count < words {
        let mut order: Vec<usize> = (0..PARAGRAPHS.len()).collect();
        rng.shuffle(&mut order);
        for i in order {
            if count >= words {
                break;
            }
            count += PARAGRAPHS[i].split_whitespace().count();
            out.push(PARAGRAPHS[i].to_string());
        }
    }
    out
}
